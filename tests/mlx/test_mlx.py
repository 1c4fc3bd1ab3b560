#!/usr/bin/env python3
"""test_mlx.py — cross-checks libqmm against MLX itself (mlx[cpu], pinned in tests/mlx/requirements.txt).

For every bits in {2,3,4,5,6,8} x group_size in {32,64,128} x dtype in {f32,f16,bf16}:
  1. qmm_quantize (CPU convention) == mx.quantize bit for bit (w, scales, biases), on random data with
     edge rows and on real weights (rows of SmolLM2 GGUF tensors, mx.load + mx.dequantize, in each dtype);
  2. qmm_dequantize == mx.dequantize bit for bit (for every output dtype);
  3. the oracle (qmm_ref_qmm_t / qmm_ref_qmm_n) vs mx.quantized_matmul within the bound of README.md;
  4. qmm_gguf_import of every quantized tensor (and the F32 ones) == mx.load of the same GGUF file;
     4b. of Q5_0/Q5_1/Q4_K/Q5_K tensors == gguf-py's dequantize (llama.cpp's reference; MLX cannot load them
         quantized);
  6. the MoE gather (qmm_ref_gather_qmm and every gather row of the ref/cpu backends through
     qmm_gather_matmul) vs mx.gather_qmm, within the same bound as 3;
  5. the GPU convention (MLX cannot run it here): hand-worked groups, a numpy model of the Metal kernel
     checked against mx.quantize first, and CPU/GPU agreement wherever neither rule applies.

Usage: test_mlx.py --lib path/to/libqmm.so [--gguf FILE] [--seed N]. Without --gguf the model path is
what scripts/fetch_model.sh prints (run from QMM_SOURCE_DIR). Inputs are fresh random every run; the seed
is printed and QMM_TEST_SEED (or --seed) replays it. Ends with "N passed, N failed"; exit 1 on a failure.
"""
import argparse
import os
import subprocess
import sys
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def setup_failure(message):
    print(f"mlx cross-check: {message}", file=sys.stderr)
    print("0 passed, 1 failed")
    sys.exit(1)


try:
    import numpy as np
    import mlx.core as mx
except ImportError as error:  # the pinned venv is missing or broken: a failure, never a silent skip
    setup_failure(f"cannot import numpy/mlx ({error}) with {sys.executable}: run `make test` "
                  "(scripts/setup.sh test creates .venv from tests/mlx/requirements.txt)")

from affine_model import bits_of, pack, quantize_model, quantize_model_packed, raw_to_f32, to_raw, unpack
from qmm_ctypes import (DTYPE_NAMES, QMM_BACKEND_CPU, QMM_BACKEND_REF, QMM_BF16, QMM_CONVENTION_CPU,
                        QMM_CONVENTION_GPU, QMM_F16, QMM_F32, QMM_GGUF_F32, QMM_GGUF_Q4_1, QMM_GGUF_Q8_0, Qmm)

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
DTYPES = (QMM_F32, QMM_F16, QMM_BF16)
MX_DTYPE = {QMM_F32: mx.float32, QMM_F16: mx.float16, QMM_BF16: mx.bfloat16}

# Set by main().
LIB = None
SEED = 0
GGUF_PATH = None
GGUF_PROBLEM = None


def case_rng(*label):
    """A generator for one case: fresh per run (SEED), independent of test order (the label)."""
    return np.random.default_rng([SEED, zlib.crc32(repr(label).encode())])


def formats():
    for dtype in DTYPES:
        for bits in BITS:
            for group_size in GROUP_SIZES:
                yield dtype, bits, group_size


def label(dtype, bits, group_size):
    return f"{DTYPE_NAMES[dtype]} bits={bits} group_size={group_size}"


# ── MLX <-> raw numpy (f32 -> float32, f16 -> float16, bf16 -> uint16 bit patterns)

def to_mx(raw, dtype):
    array = mx.array(np.ascontiguousarray(raw))
    return array.view(mx.bfloat16) if dtype == QMM_BF16 else array


def from_mx(array, dtype):
    if dtype == QMM_BF16:
        return np.array(array.view(mx.uint16))
    return np.array(array)


def f64_of(raw, dtype):
    return raw_to_f32(raw, dtype).astype(np.float64)


def describe(raw_bits, dtype):
    """A raw bit pattern of dtype as 'hex (value)'."""
    raw_bits = int(raw_bits)
    if dtype == QMM_F32:
        value = np.array([raw_bits], np.uint32).view(np.float32)[0]
    elif dtype == QMM_F16:
        value = np.array([raw_bits], np.uint16).view(np.float16)[0]
    else:
        value = np.array([raw_bits << 16], np.uint32).view(np.float32)[0]
    width = 8 if dtype == QMM_F32 else 4
    return f"0x{raw_bits:0{width}x} ({float(value):.9g})"


def first_mismatch(ours, theirs):
    where = np.argwhere(ours != theirs)
    return (len(where), tuple(int(i) for i in where[0])) if len(where) else (0, None)


def compare_quantized(testcase, what, ours, theirs, dtype, bits, row_names=None, other="MLX"):
    """Asserts (w, scales, biases) equal bit for bit; on a mismatch names the element and both values."""
    (w, scales, biases), (mw, ms, mb) = ours, theirs
    for name, a, b in (("scales", bits_of(scales, dtype), bits_of(ms, dtype)),
                       ("biases", bits_of(biases, dtype), bits_of(mb, dtype))):
        count, at = first_mismatch(a, b)
        if count:
            row = f" (row kind: {row_names[at[0]]})" if row_names else ""
            testcase.fail(f"{what}: {name}[{at[0]}, {at[1]}]{row}: qmm {describe(a[at], dtype)} vs {other} "
                          f"{describe(b[at], dtype)}; {count} of {a.size} differ")
    count, at = first_mismatch(w, mw)
    if count:
        codes, mlx_codes = unpack(w, bits), unpack(mw, bits)
        ccount, cat = first_mismatch(codes, mlx_codes)
        row = f" (row kind: {row_names[at[0]]})" if row_names else ""
        detail = (f"first differing code [{cat[0]}, {cat[1]}]: qmm {codes[cat]} vs {other} {mlx_codes[cat]}; "
                  f"{ccount} codes differ") if ccount else "codes equal (padding bits differ)"
        testcase.fail(f"{what}: w[{at[0]}, {at[1]}]{row}: qmm 0x{int(w[at]):08x} vs {other} "
                      f"0x{int(mw[at]):08x}; {count} of {w.size} words differ; {detail}")


# ── inputs

ROW_KINDS = ("normal", "uniform [-1, 3)", "normal + 1% outliers x50", "all-negative", "all-positive",
             "constant 0.37", "constant 0", "constant -2.5", "tiny (normal x 1e-4)", "half-integers (ties)",
             "normal", "uniform [-3, -1)", "normal x 1000", "normal", "uniform [0, 1)", "normal")


def edge_rows(rng, cols):
    """One row per ROW_KINDS entry, f32."""
    normal = lambda: rng.standard_normal(cols)
    rows = []
    for kind in ROW_KINDS:
        if kind == "normal":
            row = normal()
        elif kind == "uniform [-1, 3)":
            row = rng.uniform(-1, 3, cols)
        elif kind.startswith("normal + 1%"):
            row = normal()
            hit = rng.random(cols) < 0.01
            hit[rng.integers(cols)] = True
            row[hit] *= 50
        elif kind == "all-negative":
            row = -np.abs(normal()) - 0.01
        elif kind == "all-positive":
            row = np.abs(normal()) + 0.5
        elif kind.startswith("constant"):
            row = np.full(cols, float(kind.split()[1]))
        elif kind.startswith("tiny"):
            row = normal() * 1e-4
        elif kind.startswith("half-integers"):
            row = rng.integers(-8, 8, cols) / 2
        elif kind == "uniform [-3, -1)":
            row = rng.uniform(-3, -1, cols)
        elif kind == "normal x 1000":
            row = normal() * 1000
        elif kind == "uniform [0, 1)":
            row = rng.random(cols)
        else:
            raise AssertionError(kind)
        rows.append(row)
    return np.array(rows, np.float32)


_GGUF_CACHE = {}


def need_gguf(testcase):
    if GGUF_PATH is None:
        testcase.fail(f"the real model file is unavailable: {GGUF_PROBLEM}")
    return GGUF_PATH


def mlx_gguf(testcase):
    path = need_gguf(testcase)
    if path not in _GGUF_CACHE:
        _GGUF_CACHE[path] = mx.load(path)
    return _GGUF_CACHE[path]


REAL_TENSORS = ("blk.0.attn_q", "blk.15.ffn_down", "blk.29.attn_v", "token_embd")


def real_weight_rows(testcase, dtype):
    """Rows of real GGUF tensors, dequantized by MLX (mx.load + mx.dequantize) in dtype: name -> raw."""
    arrays = mlx_gguf(testcase)
    rng = case_rng("real rows", dtype)
    result = {}
    for name in REAL_TENSORS:
        w, scales, biases = (arrays[f"{name}.{part}"] for part in ("weight", "scales", "biases"))
        bits = 32 * w.shape[1] // (scales.shape[1] * 32)  # GGUF blocks are 32 wide
        pick = mx.array(np.sort(rng.choice(w.shape[0], size=24, replace=False)).astype(np.int32))
        dense = mx.dequantize(w[pick], scales[pick].astype(MX_DTYPE[dtype]), biases[pick].astype(MX_DTYPE[dtype]),
                              group_size=32, bits=bits)
        result[name] = from_mx(dense, dtype)
    return result


# ── 1. quantize

class QuantizeAgainstMLX(unittest.TestCase):
    """qmm_quantize (CPU convention) == mx.quantize, bit for bit."""

    def check(self, what, raw, dtype, bits, group_size, row_names=None):
        ours = LIB.quantize(raw, dtype, bits, group_size, QMM_CONVENTION_CPU)
        w, s, b = mx.quantize(to_mx(raw, dtype), group_size=group_size, bits=bits)
        theirs = (np.array(w), from_mx(s, dtype), from_mx(b, dtype))
        compare_quantized(self, what, ours, theirs, dtype, bits, row_names)

    def test_random_data(self):
        for dtype, bits, group_size in formats():
            with self.subTest(label(dtype, bits, group_size)):
                rng = case_rng("quantize random", dtype, bits, group_size)
                raw = to_raw(edge_rows(rng, 384), dtype)
                self.check(label(dtype, bits, group_size), raw, dtype, bits, group_size, ROW_KINDS)

    def test_real_weights(self):
        for dtype in DTYPES:
            rows = real_weight_rows(self, dtype)
            for bits in BITS:
                for group_size in GROUP_SIZES:
                    with self.subTest(label(dtype, bits, group_size)):
                        for name, raw in rows.items():
                            cols = raw.shape[1] // group_size * group_size
                            self.check(f"{label(dtype, bits, group_size)} rows of {name}",
                                       np.ascontiguousarray(raw[:, :cols]), dtype, bits, group_size)


# ── 2. dequantize

def random_format_rows(rng, rows, cols, bits, group_size, dtype):
    """Random codes, scales +-[0.01, 0.1) (both signs, as MLX makes them) and biases [-1, 1), in dtype."""
    codes = rng.integers(0, 1 << bits, (rows, cols))
    groups = cols // group_size
    scales = rng.uniform(0.01, 0.1, (rows, groups)) * rng.choice([-1.0, 1.0], (rows, groups))
    biases = rng.uniform(-1, 1, (rows, groups))
    return pack(codes, bits), to_raw(scales, dtype), to_raw(biases, dtype)


class DequantizeAgainstMLX(unittest.TestCase):
    """qmm_dequantize == mx.dequantize(..., dtype=out_dtype), bit for bit, for every output dtype."""

    def test_every_format_and_output_dtype(self):
        for dtype, bits, group_size in formats():
            rng = case_rng("dequantize", dtype, bits, group_size)
            w1, s1, b1 = mx.quantize(to_mx(to_raw(edge_rows(rng, 384), dtype), dtype),
                                     group_size=group_size, bits=bits)
            w2, s2, b2 = random_format_rows(rng, 16, 384, bits, group_size, dtype)
            w = np.concatenate([np.array(w1), w2])
            scales = np.concatenate([from_mx(s1, dtype), s2])
            biases = np.concatenate([from_mx(b1, dtype), b2])
            for out_dtype in DTYPES:
                what = f"{label(dtype, bits, group_size)} -> {DTYPE_NAMES[out_dtype]}"
                with self.subTest(what):
                    ours = LIB.dequantize(w, scales, biases, dtype, bits, group_size, out_dtype)
                    theirs = from_mx(mx.dequantize(mx.array(w), to_mx(scales, dtype), to_mx(biases, dtype),
                                                   group_size=group_size, bits=bits,
                                                   dtype=MX_DTYPE[out_dtype]), out_dtype)
                    a, b = bits_of(ours, out_dtype), bits_of(theirs, out_dtype)
                    count, at = first_mismatch(a, b)
                    if count:
                        r, c = at
                        g = c // group_size
                        code = unpack(w[r:r + 1], bits)[0, c]
                        self.fail(f"{what}: element [{r}, {c}] (code {code}, scale "
                                  f"{describe(bits_of(scales, dtype)[r, g], dtype)}, bias "
                                  f"{describe(bits_of(biases, dtype)[r, g], dtype)}): qmm "
                                  f"{describe(a[at], out_dtype)} vs MLX {describe(b[at], out_dtype)}; "
                                  f"{count} of {a.size} differ")


# ── 3. the oracle against mx.quantized_matmul

def k_near_576(group_size):
    """SmolLM2's hidden size 576 where it is a multiple of group_size, else the next multiple (640)."""
    return 576 if 576 % group_size == 0 else (576 // group_size + 1) * group_size


class OracleAgainstMLX(unittest.TestCase):
    """qmm_ref_qmm_t / qmm_ref_qmm_n vs mx.quantized_matmul(transpose=True / False), within the bound
    documented in README.md: |ours - MLX| <= qmm_error_bound(K, dtype, exact, abs_dot, 2)."""

    def run_case(self, what, dtype, bits, group_size, M, N, K, transpose):
        rng = case_rng("oracle", what)
        rows, cols = (N, K) if transpose else (K, N)
        w, s, b = mx.quantize(to_mx(to_raw(rng.standard_normal((rows, cols)), dtype), dtype),
                              group_size=group_size, bits=bits)
        w, scales, biases = np.array(w), from_mx(s, dtype), from_mx(b, dtype)
        x = to_raw(rng.standard_normal((M, K)), dtype)

        ours = f64_of(LIB.ref_qmm(w, scales, biases, dtype, bits, group_size, x, transpose), dtype)
        exact, abs_dot = LIB.ref_dense_f64(w, scales, biases, dtype, bits, group_size, x, transpose)
        # MLX's CPU kernel accumulates in the activation dtype; f16/bf16 inputs are widened to f32 (exactly)
        # so MLX forms the same product with f32 accumulation (README.md, "The oracle bound").
        mx_f32 = lambda raw: to_mx(raw, dtype).astype(mx.float32)
        theirs = np.array(mx.quantized_matmul(mx_f32(x), mx.array(w), mx_f32(scales), mx_f32(biases),
                                              transpose=transpose, group_size=group_size, bits=bits)
                          ).astype(np.float64)

        # The f64 oracle itself, recomputed from MLX's decoding (codes via mx.dequantize with s=1, b=0).
        codes = np.array(mx.dequantize(mx.array(w), mx.ones(s.shape, mx.float32), mx.zeros(s.shape, mx.float32),
                                       group_size=group_size, bits=bits)).astype(np.float64)
        expand = lambda a: np.repeat(f64_of(a, dtype), group_size, axis=1)
        w_hat = expand(scales) * codes + expand(biases)
        w_abs = np.abs(expand(scales) * codes) + np.abs(expand(biases))
        x64 = f64_of(x, dtype)
        numpy_exact = x64 @ (w_hat.T if transpose else w_hat)
        numpy_abs = np.abs(x64) @ (w_abs.T if transpose else w_abs)

        self.assertFalse(np.isnan(ours).any(), f"{what}: NaN left in the oracle output (unwritten?)")
        tolerance = 1e-12 * numpy_abs + 1e-300
        bad = np.argwhere(np.abs(exact - numpy_exact) > tolerance)
        if len(bad):
            at = tuple(bad[0])
            self.fail(f"{what}: qmm_ref_dense_f64 out[{at[0]}, {at[1]}] = {exact[at]:.17g}, numpy f64 "
                      f"{numpy_exact[at]:.17g}; {len(bad)} differ")
        bad = np.argwhere(np.abs(abs_dot - numpy_abs) > tolerance)
        if len(bad):
            at = tuple(bad[0])
            self.fail(f"{what}: qmm_ref_dense_f64 abs_dot[{at[0]}, {at[1]}] = {abs_dot[at]:.17g}, expected "
                      f"sum_k (|s q| + |b|) |x_k| = {numpy_abs[at]:.17g}; {len(bad)} differ")

        for name, other, slack in (("the f64 oracle", exact, 1), ("MLX", theirs, 2)):
            bound = LIB.error_bound(K, dtype, exact, abs_dot, slack)
            error = np.abs(ours - other)
            bad = np.argwhere(~(error <= bound))
            if len(bad):
                at = tuple(bad[0])
                self.fail(f"{what}: out[{at[0]}, {at[1]}]: qmm {ours[at]:.17g} vs {name} {other[at]:.17g} "
                          f"(exact {exact[at]:.17g}): |error| {error[at]:.3g} > bound {bound[at]:.3g} "
                          f"(slack {slack}); {len(bad)} of {error.size} outside")

    def shapes(self, group_size, transpose):
        K = k_near_576(group_size)
        if transpose:  # (M, N, K): N = rows of W may be odd; K a multiple of group_size
            return [(1, 37, K), (7, 65, K), (16, 8, group_size)]
        return [(1, K, 37), (7, 2 * group_size, 65), (16, group_size, K)]  # N quantized: K may be odd

    def run_op(self, transpose):
        for dtype, bits, group_size in formats():
            for M, N, K in self.shapes(group_size, transpose):
                what = (f"{'qmm_t' if transpose else 'qmm_n'} {label(dtype, bits, group_size)} "
                        f"M={M} N={N} K={K}")
                with self.subTest(what):
                    self.run_case(what, dtype, bits, group_size, M, N, K, transpose)

    def test_qmm_t(self):
        self.run_op(True)

    def test_qmm_n(self):
        self.run_op(False)


# ── 6. the MoE gather against mx.gather_qmm

GATHER_EXPERTS = 8
GATHER_TOP_K = 2


def gather_patterns(rng, T):
    """(name, lhs or None, rhs, sorted) index patterns over T tokens and GATHER_EXPERTS experts."""
    # MoE routing: every token to GATHER_TOP_K distinct experts, pairs sorted by expert (stable, like a
    # router's argsort), so experts are contiguous blocks and some experts are never used.
    experts = np.array([rng.choice(GATHER_EXPERTS - 2, GATHER_TOP_K, replace=False) + 1 for _ in range(T)])
    tokens = np.repeat(np.arange(T), GATHER_TOP_K)
    flat = experts.reshape(-1)
    order = np.argsort(flat, kind="stable")
    unsorted_rhs = rng.integers(0, GATHER_EXPERTS, 9)
    unsorted_rhs[:2] = [GATHER_EXPERTS - 1, 0]  # out of order for sure
    return [
        ("top-k routing sorted by expert", tokens[order], flat[order], True),
        ("top-k routing in token order", tokens, flat, False),
        ("unsorted, rows repeated", rng.integers(0, T, 9), unsorted_rhs, False),
        ("lhs None (row i)", None, np.sort(rng.integers(0, GATHER_EXPERTS, T)), True),
        ("B=1", rng.integers(0, T, 1), rng.integers(0, GATHER_EXPERTS, 1), True),
    ]


class GatherAgainstMLX(unittest.TestCase):
    """qmm_ref_gather_qmm and every gather row (qmm_gather_matmul, forced) vs mx.gather_qmm(transpose=True):
    |ours - MLX| <= qmm_error_bound(K, dtype, exact, abs_dot, 2 * row slack) (README.md, "The oracle bound";
    f16/bf16 are widened to f32 for MLX as there), and the f64 gather equals numpy's f64 from MLX's decoding."""

    def run_case(self, what, dtype, bits, group_size, N, K, T, kernels):
        rng = case_rng("gather", what)
        w, s, b = mx.quantize(to_mx(to_raw(rng.standard_normal((GATHER_EXPERTS, N, K)), dtype), dtype),
                              group_size=group_size, bits=bits)
        w, scales, biases = np.array(w), from_mx(s, dtype), from_mx(b, dtype)
        x = to_raw(rng.standard_normal((T, K)), dtype)
        mx_f32 = lambda raw: to_mx(raw, dtype).astype(mx.float32)
        codes = np.array(mx.dequantize(mx.array(w), mx.ones(s.shape, mx.float32), mx.zeros(s.shape, mx.float32),
                                       group_size=group_size, bits=bits)).astype(np.float64)
        expand = lambda a: np.repeat(f64_of(a, dtype), group_size, axis=-1)
        w_hat = expand(scales) * codes + expand(biases)
        w_abs = np.abs(expand(scales) * codes) + np.abs(expand(biases))
        x64 = f64_of(x, dtype)
        for name, lhs, rhs, is_sorted in gather_patterns(rng, T):
            case = f"{what} {name} (B={len(rhs)})"
            rows = np.arange(len(rhs)) if lhs is None else lhs
            theirs = np.array(mx.gather_qmm(
                mx_f32(x)[:, None, :], mx.array(w), mx_f32(scales), mx_f32(biases),
                lhs_indices=None if lhs is None else mx.array(lhs.astype(np.uint32)),
                rhs_indices=mx.array(rhs.astype(np.uint32)), transpose=True, group_size=group_size, bits=bits,
                sorted_indices=is_sorted)).reshape(len(rhs), N).astype(np.float64)
            exact, abs_dot = LIB.ref_gather_dense_f64(w, scales, biases, dtype, bits, group_size, x, lhs, rhs)
            numpy_exact = np.einsum("bk,bnk->bn", x64[rows], w_hat[rhs])
            numpy_abs = np.einsum("bk,bnk->bn", np.abs(x64[rows]), w_abs[rhs])
            tolerance = 1e-12 * numpy_abs + 1e-300
            for part, a, b in (("exact", exact, numpy_exact), ("abs_dot", abs_dot, numpy_abs)):
                bad = np.argwhere(~(np.abs(a - b) <= tolerance))
                if len(bad):
                    at = tuple(bad[0])
                    self.fail(f"{case}: qmm_ref_gather_dense_f64 {part}[{at[0]}, {at[1]}] = {a[at]:.17g}, numpy f64 "
                              f"{b[at]:.17g}; {len(bad)} differ")
            outputs = [("qmm_ref_gather_qmm", 1.0,
                        LIB.ref_gather(w, scales, biases, dtype, bits, group_size, x, lhs, rhs))]
            for backend, kernel, slack in kernels:
                outputs.append((kernel, slack, LIB.gather_matmul(backend, kernel, w, scales, biases, dtype, bits,
                                                                 group_size, x, lhs, rhs, is_sorted)))
            for who, slack, raw in outputs:
                ours = f64_of(raw, dtype)
                for name_other, other, factor in (("the f64 oracle", exact, 1), ("MLX", theirs, 2)):
                    bound = LIB.error_bound(K, dtype, exact, abs_dot, factor * slack)
                    error = np.abs(ours - other)
                    bad = np.argwhere(~(error <= bound))
                    if len(bad):
                        at = tuple(bad[0])
                        self.fail(f"{case}: {who} out[{at[0]}, {at[1]}] = {ours[at]:.17g} vs {name_other} "
                                  f"{other[at]:.17g} (exact {exact[at]:.17g}): |error| {error[at]:.3g} > bound "
                                  f"{bound[at]:.3g}; {len(bad)} of {error.size} outside")

    def test_gather_qmm(self):
        kernels = [(backend, name, slack) for backend in (QMM_BACKEND_REF, QMM_BACKEND_CPU)
                   for name, slack in LIB.gather_kernels(backend)]
        self.assertTrue(any(name == "ref.gather.scalar.r1" for _, name, _ in kernels), f"gather rows: {kernels}")
        for dtype, bits, group_size in formats():
            for N, K, T in ((37, k_near_576(group_size), 5), (8, 2 * group_size, 7)):
                what = f"gather {label(dtype, bits, group_size)} E={GATHER_EXPERTS} N={N} K={K} T={T}"
                with self.subTest(what):
                    self.run_case(what, dtype, bits, group_size, N, K, T, kernels)


# ── 4. GGUF import against mx.load

class GgufImportAgainstMLX(unittest.TestCase):
    """qmm_gguf_open + qmm_gguf_import of the real SmolLM2 Q4_1 file == mx.load(path), bit for bit."""

    @classmethod
    def setUpClass(cls):
        cls.handle = None

    @classmethod
    def tearDownClass(cls):
        if cls.handle is not None:
            LIB.gguf_close(cls.handle)
            cls.handle = None

    def open(self):
        if type(self).handle is None:
            type(self).handle = LIB.gguf_open(need_gguf(self))
        handle = type(self).handle
        infos = [LIB.gguf_tensor_info(handle, i) for i in range(LIB.gguf_tensor_count(handle))]
        return handle, infos

    def check_quantized(self, handle, index, info, arrays, bits):
        name = info.name.decode()
        base = name[:-len(".weight")] if name.endswith(".weight") else name
        kind, ours = LIB.gguf_import(handle, index)
        self.assertEqual(kind, "quantized", f"{name}: imported as {kind}")
        w, scales, biases = (arrays[f"{base}.{part}"] for part in ("weight", "scales", "biases"))
        self.assertEqual((ours["bits"], ours["group_size"], ours["dtype"]), (bits, 32, QMM_F16),
                         f"{name}: format (bits, group_size, dtype)")
        self.assertEqual((ours["rows"], ours["cols"] * bits // 32), tuple(w.shape), f"{name}: shape")
        self.assertEqual(tuple(info.shape[i] for i in range(info.ndim)), (ours["rows"], ours["cols"]),
                         f"{name}: qmm_gguf_tensor_info shape")
        for part, a, b in (("weight", ours["w"], np.array(w)),
                           ("scales", bits_of(ours["scales"], QMM_F16), bits_of(from_mx(scales, QMM_F16), QMM_F16)),
                           ("biases", bits_of(ours["biases"], QMM_F16), bits_of(from_mx(biases, QMM_F16), QMM_F16))):
            count, at = first_mismatch(a, b)
            if count:
                self.fail(f"{name}: {part}[{at[0]}, {at[1]}]: qmm 0x{int(a[at]):x} vs MLX 0x{int(b[at]):x}; "
                          f"{count} of {a.size} differ")

    def test_every_q4_1_tensor(self):
        arrays = mlx_gguf(self)
        handle, infos = self.open()
        q4_1 = [(i, info) for i, info in enumerate(infos) if info.type == QMM_GGUF_Q4_1]
        self.assertGreater(len(q4_1), 0, "no Q4_1 tensor listed")
        for index, info in q4_1:
            with self.subTest(info.name.decode()):
                self.check_quantized(handle, index, info, arrays, 4)

    def test_token_embd_q8_0(self):
        arrays = mlx_gguf(self)
        handle, infos = self.open()
        found = [(i, info) for i, info in enumerate(infos) if info.name == b"token_embd.weight"]
        self.assertEqual(len(found), 1, "token_embd.weight listed once")
        index, info = found[0]
        self.assertEqual(info.type, QMM_GGUF_Q8_0, f"token_embd.weight type {info.type_name.decode()}")
        self.check_quantized(handle, index, info, arrays, 8)

    def test_f32_tensors(self):
        arrays = mlx_gguf(self)
        handle, infos = self.open()
        f32 = [(i, info) for i, info in enumerate(infos) if info.type == QMM_GGUF_F32]
        self.assertGreater(len(f32), 0, "no F32 tensor listed")
        for index, info in f32:
            name = info.name.decode()
            with self.subTest(name):
                kind, ours = LIB.gguf_import(handle, index)
                self.assertEqual(kind, "float", f"{name}: imported as {kind}")
                theirs = np.array(arrays[name])
                self.assertEqual((ours["dtype"], ours["shape"]), (QMM_F32, theirs.shape), f"{name}: dtype/shape")
                self.assertTrue(ours["data"] == theirs.astype(np.float32).tobytes(), f"{name}: data differs")

    def test_same_quantized_set(self):
        arrays = mlx_gguf(self)
        _, infos = self.open()
        ours = {info.name.decode()[:-len(".weight")] for info in infos
                if info.type in (QMM_GGUF_Q4_1, QMM_GGUF_Q8_0)}
        theirs = {key[:-len(".scales")] for key in arrays if key.endswith(".scales")}
        self.assertEqual(ours, theirs, "quantized tensors listed by qmm vs those mx.load dequantizes")
        names = {info.name.decode() for info in infos}
        self.assertEqual(len(names), len(infos), "tensor names unique")


# ── 4b. GGUF import of the types MLX's loader does not keep quantized, against llama.cpp's gguf-py

GGUF_PY_TYPES = ("Q5_0", "Q5_1", "Q4_K", "Q5_K")


class GgufImportAgainstGgufPy(unittest.TestCase):
    """Q5_0, Q5_1, Q4_K and Q5_K tensors of random blocks, written by gguf-py's GGUFWriter: qmm_gguf_import,
    decoded as round_f32(s·q + b) in numpy f32, == gguf.quants.dequantize (ggml's dequantize_row_* in
    numpy), value for value; for Q4_K/Q5_K also mx.dequantize of the imported arrays. MLX's loader cannot be
    the reference: 0.32.4 refuses Q5_0/Q5_1/Q5_K and dequantizes Q4_K to f16, giving its odd sub-blocks the scale
    and min of the even one before them (gguf-tools' gguflib.c)."""

    def random_blocks(self, rng, qtype, blocks):
        """Random raw blocks: every byte random, then the f16 d (and m / dmin) replaced by finite values."""
        import gguf
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(blocks, type_size), dtype=np.uint8)
        d = (rng.uniform(1e-3, 0.1, blocks) * rng.choice([-1.0, 1.0], blocks)).astype(np.float16)
        raw[:, 0:2] = d.view(np.uint8).reshape(blocks, 2)
        if qtype.name in ("Q5_1", "Q4_K", "Q5_K"):
            m = rng.uniform(-1.0, 1.0, blocks).astype(np.float16)
            raw[:, 2:4] = m.view(np.uint8).reshape(blocks, 2)
        if blocks > 1:  # edge values: a large f16 d (the largest for K-quants; Q5_0's −16d must stay finite), a
            # subnormal m / dmin
            raw[1, 0:2] = np.array([0x7BFF if qtype.name.endswith("_K") else 0x67FF], np.uint16).view(np.uint8)
            if qtype.name != "Q5_0":
                raw[1, 2:4] = np.array([0x8001], np.uint16).view(np.uint8)
        return raw, block_size, type_size

    def test_types_against_gguf_py(self):
        try:
            import gguf
            from gguf.quants import dequantize
        except ImportError as error:  # pinned in requirements.txt: a failure, never a skip
            self.fail(f"cannot import gguf (llama.cpp's gguf-py): {error}; run `make test`")
        import tempfile
        rng = case_rng("gguf-py")
        shapes = {"Q5_0": (3, 96), "Q5_1": (4, 64), "Q4_K": (3, 512), "Q5_K": (2, 768)}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "types.gguf")
            writer = gguf.GGUFWriter(path, "llama")
            expected = {}
            for name in GGUF_PY_TYPES:
                qtype = gguf.GGMLQuantizationType[name]
                rows, cols = shapes[name]
                block_size = gguf.GGML_QUANT_SIZES[qtype][0]
                raw, _, type_size = self.random_blocks(rng, qtype, rows * cols // block_size)
                raw = raw.reshape(rows, cols // block_size * type_size)
                writer.add_tensor(f"blk.0.{name.lower()}.weight", raw, raw_dtype=qtype)
                expected[name] = (dequantize(raw, qtype), rows, cols)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()

            handle = LIB.gguf_open(path)
            try:
                count = LIB.gguf_tensor_count(handle)
                self.assertEqual(count, len(GGUF_PY_TYPES), "tensor count")
                for index in range(count):
                    info = LIB.gguf_tensor_info(handle, index)
                    name = info.type_name.decode()
                    with self.subTest(name):
                        theirs, rows, cols = expected[name]
                        self.assertEqual(info.importable, 1, f"{name}: importable")
                        kind, ours = LIB.gguf_import(handle, index)
                        self.assertEqual(kind, "quantized", f"{name}: imported as {kind}")
                        k_quant = name.endswith("_K")
                        want = (5 if name.startswith("Q5") else 4, 32, QMM_F32 if k_quant else QMM_F16)
                        self.assertEqual((ours["bits"], ours["group_size"], ours["dtype"]), want,
                                         f"{name}: format (bits, group_size, dtype)")
                        self.assertEqual((ours["rows"], ours["cols"]), (rows, cols), f"{name}: shape")
                        q = unpack(ours["w"], ours["bits"]).astype(np.float32)
                        s = np.repeat(raw_to_f32(ours["scales"], ours["dtype"]), 32, axis=1)
                        b = np.repeat(raw_to_f32(ours["biases"], ours["dtype"]), 32, axis=1)
                        value = s * q + b  # numpy f32: s·q exact, one rounding for + b
                        theirs = np.ascontiguousarray(theirs, dtype=np.float32).reshape(rows, cols)
                        # Equal as f32 values: ±0 compare equal (ggml's d·(q − 16) is −0 where d < 0 and
                        # q = 16; s·q + b is +0 there), every other value bit for bit (no NaN: d is finite).
                        count_bad, at = first_mismatch(value, theirs)
                        if count_bad:
                            self.fail(f"{name}: weight [{at[0]}, {at[1]}]: qmm {value[at]!r} vs gguf-py "
                                      f"{theirs[at]!r}; {count_bad} of {value.size} differ")
                        if k_quant:  # MLX reads the imported arrays as they are: its f32 dequantize agrees too
                            arrays = [mx.array(ours[part]) for part in ("w", "scales", "biases")]
                            mlx_value = np.array(mx.dequantize(*arrays, group_size=32, bits=ours["bits"]))
                            count_bad, at = first_mismatch(mlx_value, theirs)
                            if count_bad:
                                self.fail(f"{name}: mx.dequantize of the import [{at[0]}, {at[1]}] "
                                          f"{mlx_value[at]!r} vs gguf-py {theirs[at]!r}; {count_bad} differ")
            finally:
                LIB.gguf_close(handle)


# ── 5. the GPU convention

# Hand-worked groups (group_size 32; the 4 or 5 listed values repeat across the group). Arithmetic is
# IEEE f32; n = 2^bits - 1. The expected values below were worked by hand, not by the library:
HAND_CASES = [
    dict(  # max = -1 < 0: the GPU range is [min, 0] = [-3, 0]
        name="all-negative group, GPU range [min, 0]", dtype=QMM_F32, bits=2,
        values=[-3, -2, -1.5, -1] * 8,
        # GPU: s0 = (0 - -3)/3 = 1; |min| > |0| -> s = 1, e = -3; q0 = round(-3) = -3 -> s = 1, b = -3;
        #      q = round(w + 3): -3 -> 0, -2 -> 1, -1.5 -> round(1.5) = 2, -1 -> 2.
        gpu=(0x3F800000, 0xC0400000, [0, 1, 2, 2]),
        # CPU: s0 = 2/3 = 0.6666667f; e = -3; -3/0.6666667f rounds to exactly -4.5 in f32, rint -> -4;
        #      s = -3/-4 = 0.75, b = -3; q = rint((w + 3)/0.75): 0, 1.33 -> 1, 2, 2.67 -> 3.
        cpu=(0x3F400000, 0xC0400000, [0, 1, 2, 3])),
    dict(  # ties in the codes: rint goes to even, Metal's round away from zero
        name="code ties at .5 round half away from zero", dtype=QMM_F32, bits=2,
        values=[0, 0.5, 1.5, 2.5] * 7 + [3] * 4,
        # both: min 0, max 3; s0 = 1; |0| > |3| false -> s = -1, e = 3; q0 = -3 -> s = -1, b = 3;
        #       q = round(3 - w): 0 -> 3, 0.5 -> 2.5, 1.5 -> 1.5, 2.5 -> 0.5, 3 -> 0.
        gpu=(0xBF800000, 0x40400000, [3, 3, 2, 1] * 7 + [0] * 4),
        cpu=(0xBF800000, 0x40400000, [3, 2, 2, 0] * 7 + [0] * 4)),
    dict(  # a tie in q0 = round(edge/scale) changes the scale itself
        name="q0 tie: round(-2.5) = -3 on GPU, rint = -2 on CPU", dtype=QMM_F32, bits=2,
        values=[-5, 1, 0, -2.5] * 8,
        # both: min -5, max 1; s0 = 6/3 = 2; |-5| > |1| -> s = 2, e = -5; edge/s = -2.5.
        # GPU: q0 = -3 -> s = -5/-3 = 1.6666666f (0x3FD55555), b = -5;
        #      q = round((w + 5)/s): 0, 3.6 -> min(4, 3) = 3, 3.0000002 -> 3, 1.5 -> 2.
        gpu=(0x3FD55555, 0xC0A00000, [0, 3, 3, 2]),
        # CPU: q0 = -2 -> s = 2.5, b = -5; q = rint((w + 5)/2.5): 0, 2.4 -> 2, 2, 1.
        cpu=(0x40200000, 0xC0A00000, [0, 2, 2, 1])),
    dict(  # the same in f16: the f32 scale is rounded once at the end; codes use the f32 scale
        name="q0 tie, f16 scale rounding", dtype=QMM_F16, bits=2,
        values=[-5, 1, 0, -2.5] * 8,
        # GPU scale 1.6666666 -> f16: 1 + 682.67/1024 -> 1 + 683/1024 = 0x3EAB; bias -5 = 0xC500.
        gpu=(0x3EAB, 0xC500, [0, 3, 3, 2]),
        cpu=(0x4100, 0xC500, [0, 2, 2, 1])),
    dict(  # all positive: the GPU's min is the true min (only the running max starts at 0)
        name="all-positive group: conventions agree", dtype=QMM_F32, bits=2,
        values=[1, 2, 3, 4] * 8,
        # s0 = 1; |1| > |4| false -> s = -1, e = 4; q0 = -4 -> s = -1, b = 4; q = 4 - w.
        gpu=(0xBF800000, 0x40800000, [3, 2, 1, 0]),
        cpu=(0xBF800000, 0x40800000, [3, 2, 1, 0])),
    dict(  # 4 bits, bf16, all negative with a code tie
        name="all-negative 4-bit bf16 group", dtype=QMM_BF16, bits=4,
        values=[-15, -14.5, -8, -1] * 8,
        # GPU: range [-15, 0]; s0 = 1, s = 1, b = -15; q = round(w + 15): 0, round(0.5) = 1, 7, 14.
        gpu=(0x3F80, 0xC170, [0, 1, 7, 14]),
        # CPU: s0 = 14/15 = 0.93333334f; -15/s0 = -16.07 -> q0 = -16; s = 0.9375, b = -15;
        #      q = rint((w + 15)/0.9375): 0, 0.53 -> 1, 7.47 -> 7, 14.93 -> 15.
        cpu=(0x3F70, 0xC170, [0, 1, 7, 15])),
]


class GpuConvention(unittest.TestCase):
    """qmm_quantize with QMM_CONVENTION_GPU (MLX's Metal quantizer), which MLX cannot run here."""

    def test_hand_worked_groups(self):
        for case in HAND_CASES:
            with self.subTest(case["name"]):
                dtype, bits = case["dtype"], case["bits"]
                values = np.array([case["values"]], np.float32)
                raw = to_raw(values, dtype)
                self.assertTrue(np.array_equal(raw_to_f32(raw, dtype), values), "inputs exact in dtype")
                for convention, key in ((QMM_CONVENTION_GPU, "gpu"), (QMM_CONVENTION_CPU, "cpu")):
                    scale, bias, pattern = case[key]
                    expected_codes = np.resize(np.array(pattern), 32)
                    w, s, b = LIB.quantize(raw, dtype, bits, 32, convention)
                    got = (int(bits_of(s, dtype)[0, 0]), int(bits_of(b, dtype)[0, 0]), unpack(w, bits)[0])
                    self.assertEqual(got[:2], (scale, bias),
                                     f"{key}: (scale, bias) qmm ({describe(got[0], dtype)}, "
                                     f"{describe(got[1], dtype)}) vs hand ({describe(scale, dtype)}, "
                                     f"{describe(bias, dtype)})")
                    self.assertEqual(got[2].tolist(), expected_codes.tolist(), f"{key}: codes")
                # The CPU column of the hand-worked table is what MLX itself gives.
                mw, ms, mb = mx.quantize(to_mx(raw, dtype), group_size=32, bits=bits)
                scale, bias, pattern = case["cpu"]
                self.assertEqual((int(bits_of(from_mx(ms, dtype), dtype)[0, 0]),
                                  int(bits_of(from_mx(mb, dtype), dtype)[0, 0])), (scale, bias),
                                 "MLX agrees with the hand-worked CPU scale/bias")
                self.assertEqual(unpack(np.array(mw), bits)[0].tolist(), np.resize(np.array(pattern), 32).tolist(),
                                 "MLX agrees with the hand-worked CPU codes")

    def test_random_data_against_model(self):
        """GPU convention == the numpy model of the Metal kernel, bit for bit; the model's CPU branch is
        first shown equal to mx.quantize on the same data, so the model is MLX's arithmetic."""
        for dtype, bits, group_size in formats():
            what = label(dtype, bits, group_size)
            with self.subTest(what):
                rng = case_rng("gpu model", dtype, bits, group_size)
                raw = to_raw(edge_rows(rng, 384), dtype)
                values = raw_to_f32(raw, dtype)
                mw, ms, mb = mx.quantize(to_mx(raw, dtype), group_size=group_size, bits=bits)
                compare_quantized(self, f"{what} [TEST MODEL, CPU branch vs mx.quantize — fix the test]",
                                  quantize_model_packed(values, bits, group_size, dtype, gpu=False),
                                  (np.array(mw), from_mx(ms, dtype), from_mx(mb, dtype)), dtype, bits, ROW_KINDS)
                ours = LIB.quantize(raw, dtype, bits, group_size, QMM_CONVENTION_GPU)
                compare_quantized(self, f"{what} GPU convention vs model",
                                  ours, quantize_model_packed(values, bits, group_size, dtype, gpu=True),
                                  dtype, bits, ROW_KINDS, other="model")

    def test_conventions_differ_only_where_expected(self):
        """CPU and GPU results agree on every group with max >= 0 and no .5 tie (under either
        convention), and differ in scale on every group of the 'uniform [-3, -1)' row."""
        negative_row = ROW_KINDS.index("uniform [-3, -1)")
        for dtype, bits, group_size in formats():
            what = label(dtype, bits, group_size)
            with self.subTest(what):
                rng = case_rng("conventions", dtype, bits, group_size)
                raw = to_raw(edge_rows(rng, 384), dtype)
                values = raw_to_f32(raw, dtype)
                rows, cols = values.shape
                groups = cols // group_size
                cpu = LIB.quantize(raw, dtype, bits, group_size, QMM_CONVENTION_CPU)
                gpu = LIB.quantize(raw, dtype, bits, group_size, QMM_CONVENTION_GPU)
                *_, cpu_ties = quantize_model(values, bits, group_size, gpu=False)
                *_, gpu_ties = quantize_model(values, bits, group_size, gpu=True)
                group_max = values.reshape(rows, groups, group_size).max(axis=2)
                same = lambda part: bits_of(cpu[part], dtype) == bits_of(gpu[part], dtype)
                codes_same = (unpack(cpu[0], bits) == unpack(gpu[0], bits)).reshape(rows, groups, group_size).all(axis=2)
                agree = same(1) & same(2) & codes_same
                must_agree = (group_max >= 0) & ~cpu_ties & ~gpu_ties
                bad = np.argwhere(must_agree & ~agree)
                if len(bad):
                    r, g = bad[0]
                    self.fail(f"{what}: group [{r}, {g}] ({ROW_KINDS[r]}): max >= 0 and no tie, yet CPU "
                              f"(scale {describe(bits_of(cpu[1], dtype)[r, g], dtype)}) and GPU (scale "
                              f"{describe(bits_of(gpu[1], dtype)[r, g], dtype)}) differ; {len(bad)} groups")
                self.assertGreater(int(must_agree.sum()), rows, f"{what}: enough groups where they must agree")
                differ = ~same(1)[negative_row]
                self.assertTrue(differ.all(), f"{what}: all-negative groups {np.argwhere(~differ).ravel().tolist()} "
                                              "have the same scale under both conventions")


# ── runner: counts every subtest (or test without subtests) once; prints "N passed, N failed"

class CountingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0
        self.failed = 0
        self._had_subtests = set()

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        self._had_subtests.add(test.id())
        if err is None:
            self.passed += 1
        else:
            self.failed += 1

    def addSuccess(self, test):
        super().addSuccess(test)
        if test.id() not in self._had_subtests:
            self.passed += 1

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.failed += 1

    def addError(self, test, err):
        super().addError(test, err)
        self.failed += 1


def resolve_gguf(explicit):
    """--gguf, else the path scripts/fetch_model.sh prints (it downloads the file once into .cache/)."""
    if explicit:
        return (explicit, None) if os.path.isfile(explicit) else (None, f"--gguf {explicit}: no such file")
    source = os.environ.get("QMM_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
    script = os.path.join(source, "scripts", "fetch_model.sh")
    try:
        done = subprocess.run([script], cwd=source, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{script} failed: {error}"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not os.path.isfile(lines[-1]):
        return None, f"{script} exited {done.returncode}: {done.stderr.strip()[-500:]} (run `make test`)"
    return lines[-1], None


def main():
    global LIB, SEED, GGUF_PATH, GGUF_PROBLEM
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", required=True, help="path of libqmm.so")
    parser.add_argument("--gguf", help="the SmolLM2 Q4_1 GGUF (default: what scripts/fetch_model.sh prints)")
    parser.add_argument("--seed", type=lambda s: int(s, 0), help="replay a run (also QMM_TEST_SEED)")
    parser.add_argument("-k", dest="pattern", help="run only tests whose id contains this text")
    parser.add_argument("-v", dest="verbose", action="store_true")
    args = parser.parse_args()

    if args.seed is not None:
        SEED = args.seed
    elif os.environ.get("QMM_TEST_SEED"):
        SEED = int(os.environ["QMM_TEST_SEED"], 0)
    else:
        SEED = int.from_bytes(os.urandom(6), "little")
    try:
        LIB = Qmm(args.lib)
    except OSError as error:
        setup_failure(f"cannot load {args.lib}: {error}")
    GGUF_PATH, GGUF_PROBLEM = resolve_gguf(args.gguf)
    print(f"mlx cross-check: mlx {mx.__version__}, numpy {np.__version__}, lib {args.lib}, "
          f"gguf {GGUF_PATH or GGUF_PROBLEM}, seed {SEED}", flush=True)
    if LIB.missing():
        print(f"note: libqmm does not export {', '.join(LIB.missing())}", flush=True)

    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for case in (QuantizeAgainstMLX, DequantizeAgainstMLX, OracleAgainstMLX, GgufImportAgainstMLX,
                 GgufImportAgainstGgufPy, GpuConvention, GatherAgainstMLX):
        for test in loader.loadTestsFromTestCase(case):
            if not args.pattern or args.pattern in test.id():
                suite.addTest(test)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2 if args.verbose else 1,
                                     resultclass=CountingResult)
    result = runner.run(suite)
    if result.failed:
        print(f"(replay with QMM_TEST_SEED={SEED})")
    if result.passed + result.failed == 0:
        print("no case ran")
        result.failed = 1
    print(f"{result.passed} passed, {result.failed} failed")
    return 0 if result.failed == 0 and result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
