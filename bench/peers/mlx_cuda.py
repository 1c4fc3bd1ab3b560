#!/usr/bin/env python3
"""qmm bench peer: MLX's own CUDA mx.quantized_matmul (PyPI mlx + mlx-cuda-13), timed as mlx_cpu.py times the
CPU (wall time per product, each product evaluated in turn, weights rotated through copies > 2x the L2).
Absent (with the reason) when mlx.core cannot be imported or has no GPU device."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mlx_cpu  # noqa: E402

if __name__ == "__main__":
    mlx_cpu.main(device="gpu", peer="mlx-cuda")
