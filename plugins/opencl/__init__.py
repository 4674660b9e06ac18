"""OpenCL backend: runs the GPU-supported ops of a partition as pre-bound OpenCL kernels on PHWC4 buffers."""

__version__ = "0.1.0"
