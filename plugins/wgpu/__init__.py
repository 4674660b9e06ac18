"""WebGPU backend for delegate: WGSL kernels on PHWC4 buffers through wgpu-py."""

__version__ = "0.1.0"
