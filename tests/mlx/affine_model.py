"""affine_model.py — numpy helpers for the MLX cross-check: dtype rounding, bit packing, and a model of
MLX's affine quantizer in IEEE f32 (numpy float32 arithmetic is IEEE per operation, no FMA contraction).

The model exists for the GPU convention, which MLX cannot run on this machine: it is first shown equal to
mx.quantize (CPU convention, bit for bit), then its two GPU switches (running max starts at 0; round half
away from zero — mlx/backend/metal/kernels/quantized.h, affine_quantize) give the GPU reference.
"""
import numpy as np

from qmm_ctypes import BITS_VIEW, QMM_BF16, QMM_F16, QMM_F32


def f32_to_bf16_bits(values):
    """f32 -> bf16 bits, round to nearest even (inputs here are finite)."""
    u = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def to_raw(values_f32, dtype):
    """Rounds f32 values once (RNE) to dtype and returns the raw numpy array of that dtype."""
    values_f32 = np.asarray(values_f32, np.float32)
    if dtype == QMM_F32:
        return values_f32.copy()
    if dtype == QMM_F16:
        return values_f32.astype(np.float16)
    return f32_to_bf16_bits(values_f32)


def raw_to_f32(raw, dtype):
    """Raw dtype array -> exact f32 values."""
    if dtype == QMM_BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def bits_of(raw, dtype):
    """The bit patterns of a raw array (for bit-for-bit compares: -0 and NaN payloads count)."""
    return np.ascontiguousarray(raw).view(BITS_VIEW[dtype])


def pack(codes, bits):
    """codes [rows, cols] (each < 2^bits) -> uint32 [rows, cols*bits/32]: each row one little-endian,
    LSB-first bit stream (DESIGN.md §1)."""
    rows, cols = codes.shape
    stream = ((codes.astype(np.uint32)[:, :, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    packed = np.packbits(stream.reshape(rows, cols * bits), axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view(np.uint32).reshape(rows, cols * bits // 32)


def unpack(w, bits):
    """The inverse of pack: uint32 [rows, words] -> codes [rows, words*32/bits] (int64)."""
    rows, words = w.shape
    stream = np.unpackbits(np.ascontiguousarray(w).view(np.uint8).reshape(rows, words * 4), axis=1,
                           bitorder="little")
    cols = words * 32 // bits
    return stream.reshape(rows, cols, bits).astype(np.int64) @ (1 << np.arange(bits, dtype=np.int64))


def round_half_even(v):
    return np.rint(v)


def round_half_away(v):
    """Metal's round(): half away from zero, on f32 values (exact: trunc and the difference are exact)."""
    t = np.trunc(v)
    frac = v - t
    return (t + np.where(np.abs(frac) >= np.float32(0.5), np.sign(v), np.float32(0))).astype(np.float32)


def is_tie(v):
    """Whether an f32 value lies exactly halfway between two integers."""
    return np.abs(v - np.trunc(v)) == np.float32(0.5)


def quantize_model(w_f32, bits, group_size, gpu):
    """MLX affine quantization of w_f32 [rows, cols] (values already in the weight dtype, given as f32).
    Returns codes [rows, cols] (int64), f32 scales and biases [rows, groups] (before the dtype rounding),
    and per-group tie flags (a q0 or code argument exactly at k + 0.5)."""
    rows, cols = w_f32.shape
    g = np.asarray(w_f32, np.float32).reshape(rows, cols // group_size, group_size)
    n_bins = np.float32((1 << bits) - 1)
    eps = np.float32(1e-7)
    w_max = g.max(axis=2)
    w_min = g.min(axis=2)
    if gpu:
        w_max = np.maximum(w_max, np.float32(0))  # the Metal kernel's running max starts at 0
    rnd = round_half_away if gpu else round_half_even
    scale = np.maximum((w_max - w_min) / n_bins, eps).astype(np.float32)
    mask = np.abs(w_min) > np.abs(w_max)
    scale = np.where(mask, scale, -scale).astype(np.float32)
    edge = np.where(mask, w_min, w_max).astype(np.float32)
    q0_argument = (edge / scale).astype(np.float32)
    q0 = rnd(q0_argument)
    nonzero = q0 != 0
    scale = np.where(nonzero, edge / np.where(nonzero, q0, np.float32(1)), scale).astype(np.float32)
    bias = np.where(nonzero, edge, np.float32(0)).astype(np.float32)
    argument = ((g - bias[:, :, None]) / scale[:, :, None]).astype(np.float32)
    codes = np.clip(rnd(argument), 0, n_bins).astype(np.int64).reshape(rows, cols)
    ties = is_tie(q0_argument) | is_tie(argument).any(axis=2)
    return codes, scale, bias, ties


def quantize_model_packed(w_f32, bits, group_size, dtype, gpu):
    """quantize_model, packed and with scales/biases rounded once to dtype (raw arrays)."""
    codes, scale, bias, _ = quantize_model(w_f32, bits, group_size, gpu)
    return pack(codes, bits), to_raw(scale, dtype), to_raw(bias, dtype)
