"""The numpy CPU backend: runs every op; the fallback and the reference for the GPU backends."""
