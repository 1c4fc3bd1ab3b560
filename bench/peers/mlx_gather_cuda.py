#!/usr/bin/env python3
"""qmm bench --gather --backend cuda peer: MLX's own CUDA mx.gather_qmm (PyPI mlx + mlx-cuda-13), timed by
mlx_gather_cpu.py with device gpu (a pass of calls evaluated by one mx.eval, as the bench streams
qmm_gather_matmul's calls and waits for the last). Absent (with the reason) when mlx.core cannot be imported or has
no GPU device."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mlx_gather_cpu  # noqa: E402

if __name__ == "__main__":
    mlx_gather_cpu.main(device="gpu", peer="mlx-gather-cuda")
