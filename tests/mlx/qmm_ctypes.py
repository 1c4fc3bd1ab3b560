"""qmm_ctypes.py — ctypes bindings to libqmm.so for the MLX cross-check (only what the test calls).

Structures mirror include/qmm.h field for field (C enums are `int` in the x86-64/AArch64 ABIs). Every
function gets argtypes/restype before use, so a wrong Python argument fails in ctypes rather than in C.
A failing qmm call raises QmmCallError with qmm_status_string + qmm_last_error. A function the library
does not export yet (its engineer has not landed it) raises QmmMissing naming it.

Float data crosses the boundary as "raw" numpy arrays: f32 -> np.float32, f16 -> np.float16,
bf16 -> np.uint16 (numpy has no bfloat16; the bits are what matter).
"""
import ctypes
from ctypes import POINTER, Structure, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32, c_void_p

import numpy as np

QMM_F32, QMM_F16, QMM_BF16 = 0, 1, 2
QMM_U32 = 8
QMM_CONVENTION_CPU, QMM_CONVENTION_GPU = 0, 1
QMM_MAX_DIMS = 8
QMM_GGUF_F32, QMM_GGUF_F16, QMM_GGUF_Q4_0, QMM_GGUF_Q4_1, QMM_GGUF_Q8_0, QMM_GGUF_BF16 = 0, 1, 2, 3, 8, 30
QMM_GGUF_Q5_0, QMM_GGUF_Q5_1, QMM_GGUF_Q4_K, QMM_GGUF_Q5_K = 6, 7, 12, 13

DTYPE_NAMES = {QMM_F32: "f32", QMM_F16: "f16", QMM_BF16: "bf16"}
RAW_NUMPY = {QMM_F32: np.float32, QMM_F16: np.float16, QMM_BF16: np.uint16}
BITS_VIEW = {QMM_F32: np.uint32, QMM_F16: np.uint16, QMM_BF16: np.uint16}
# A quiet NaN per dtype, used to poison outputs before a call so an unwritten element cannot pass.
NAN_BITS = {QMM_F32: 0x7FC00000, QMM_F16: 0x7E00, QMM_BF16: 0x7FC0}


class qmm_qmatrix(Structure):
    _fields_ = [
        ("w", POINTER(c_uint32)),
        ("scales", c_void_p),
        ("biases", c_void_p),
        ("dtype", c_int),
        ("rows", c_size_t),
        ("cols", c_size_t),
        ("bits", c_int),
        ("group_size", c_int),
    ]


class qmm_tensor(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", c_int64 * QMM_MAX_DIMS),
        ("data", c_void_p),
        ("nbytes", c_size_t),
    ]


class qmm_gguf_tensor_info(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("type", c_uint32),
        ("type_name", c_char_p),
        ("ndim", c_int),
        ("shape", c_int64 * QMM_MAX_DIMS),
        ("nbytes", c_size_t),
        ("importable", c_int),
        ("why_not", c_char_p),
    ]


class qmm_kernel_info(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("backend", c_int),
        ("op", c_int),
        ("family", c_char_p),
        ("bm", c_int),
        ("bn", c_int),
        ("bk", c_int),
        ("threads", c_int),
        ("tolerance_slack", c_double),
        ("description", c_char_p),
        ("batch_invariant_order", c_char_p),
    ]


class qmm_gather_options(Structure):
    _fields_ = [("kernel", c_char_p), ("sorted_indices", c_int), ("batch_invariant", c_int)]


QMM_OP_GATHER = 2
QMM_BACKEND_REF, QMM_BACKEND_CPU, QMM_BACKEND_CUDA = 0, 1, 2


class QmmCallError(RuntimeError):
    """A qmm function returned a status other than QMM_OK."""


class QmmMissing(RuntimeError):
    """libqmm does not export a function the test needs (not implemented yet)."""


# name -> (restype, argtypes); status-returning functions use c_int.
_SIGNATURES = {
    "qmm_status_string": (c_char_p, [c_int]),
    "qmm_last_error": (c_char_p, []),
    "qmm_quantize": (c_int, [c_void_p, c_int, c_size_t, c_size_t, c_int, c_int, c_int,
                             POINTER(c_uint32), c_void_p, c_void_p]),
    "qmm_dequantize": (c_int, [POINTER(qmm_qmatrix), c_void_p, c_int]),
    "qmm_ref_qmm_t": (c_int, [POINTER(qmm_qmatrix), c_void_p, c_size_t, c_void_p]),
    "qmm_ref_qmm_n": (c_int, [POINTER(qmm_qmatrix), c_void_p, c_size_t, c_void_p]),
    "qmm_ref_dense_f64": (c_int, [POINTER(qmm_qmatrix), c_void_p, c_size_t, c_int,
                                  POINTER(c_double), POINTER(c_double)]),
    "qmm_error_bound": (c_double, [c_size_t, c_int, c_double, c_double, c_double]),
    "qmm_ref_gather_qmm": (c_int, [POINTER(qmm_qmatrix), c_size_t, c_void_p, c_size_t, POINTER(c_uint32),
                                   POINTER(c_uint32), c_size_t, c_void_p]),
    "qmm_ref_gather_dense_f64": (c_int, [POINTER(qmm_qmatrix), c_size_t, c_void_p, c_size_t, POINTER(c_uint32),
                                         POINTER(c_uint32), c_size_t, POINTER(c_double), POINTER(c_double)]),
    "qmm_context_create": (c_int, [c_int, c_int, POINTER(c_void_p)]),
    "qmm_context_destroy": (None, [c_void_p]),
    "qmm_kernel_count": (c_size_t, [c_void_p]),
    "qmm_kernel_get": (c_int, [c_void_p, c_size_t, POINTER(qmm_kernel_info)]),
    "qmm_kernel_usable": (c_int, [c_void_p, c_size_t, POINTER(c_char_p)]),
    "qmm_weights_create_experts": (c_int, [c_void_p, POINTER(qmm_qmatrix), c_size_t, POINTER(c_void_p)]),
    "qmm_weights_destroy": (None, [c_void_p]),
    "qmm_buffer_create": (c_int, [c_void_p, c_int, c_size_t, POINTER(c_void_p)]),
    "qmm_buffer_destroy": (None, [c_void_p]),
    "qmm_buffer_write": (c_int, [c_void_p, c_void_p, c_size_t]),
    "qmm_buffer_read": (c_int, [c_void_p, c_void_p, c_size_t]),
    "qmm_buffer_poison": (c_int, [c_void_p]),
    "qmm_gather_matmul": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, POINTER(c_uint32), POINTER(c_uint32),
                                  c_size_t, c_void_p, POINTER(qmm_gather_options), POINTER(qmm_kernel_info)]),
    "qmm_gguf_open": (c_int, [c_char_p, POINTER(c_void_p)]),
    "qmm_gguf_close": (None, [c_void_p]),
    "qmm_gguf_tensor_count": (c_size_t, [c_void_p]),
    "qmm_gguf_tensor_info_get": (c_int, [c_void_p, c_size_t, POINTER(qmm_gguf_tensor_info)]),
    "qmm_gguf_import": (c_int, [c_void_p, c_size_t, POINTER(c_int), POINTER(qmm_qmatrix),
                                POINTER(qmm_tensor)]),
    "qmm_gguf_import_free": (None, [POINTER(qmm_qmatrix), POINTER(qmm_tensor)]),
}


def _ptr(array):
    return ctypes.c_void_p(array.ctypes.data)


def _u32ptr(array):
    return array.ctypes.data_as(POINTER(c_uint32))


class Qmm:
    """libqmm loaded from a path, with the functions of _SIGNATURES declared."""

    def __init__(self, path):
        self.path = path
        self._lib = ctypes.CDLL(path)
        self._functions = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                function = getattr(self._lib, name)
            except AttributeError:
                continue
            function.restype = restype
            function.argtypes = argtypes
            self._functions[name] = function

    def missing(self):
        return sorted(set(_SIGNATURES) - set(self._functions))

    def fn(self, name):
        if name not in self._functions:
            raise QmmMissing(f"{self.path} does not export {name} (not implemented yet?)")
        return self._functions[name]

    def check(self, name, status):
        if status != 0:
            text = self.fn("qmm_status_string")(status).decode()
            message = self.fn("qmm_last_error")().decode()
            raise QmmCallError(f"{name} -> {text} ({status}): {message!r}")

    def call(self, name, *args):
        self.check(name, self.fn(name)(*args))

    # ── quantize / dequantize

    def quantize(self, w_raw, dtype, bits, group_size, convention):
        """w_raw: raw [rows, cols] array of dtype. Returns (w uint32, scales raw, biases raw); outputs
        are poisoned first (codes all ones, scales/biases NaN) so anything unwritten fails the compare."""
        rows, cols = w_raw.shape
        w_raw = np.ascontiguousarray(w_raw)
        out_w = np.full((rows, cols * bits // 32), 0xFFFFFFFF, np.uint32)
        groups = cols // group_size
        scales = np.full((rows, groups), NAN_BITS[dtype], BITS_VIEW[dtype]).view(RAW_NUMPY[dtype])
        biases = np.full((rows, groups), NAN_BITS[dtype], BITS_VIEW[dtype]).view(RAW_NUMPY[dtype])
        self.call("qmm_quantize", _ptr(w_raw), dtype, rows, cols, bits, group_size, convention,
                  _u32ptr(out_w), _ptr(scales), _ptr(biases))
        return out_w, scales, biases

    @staticmethod
    def qmatrix(w, scales, biases, dtype, rows, cols, bits, group_size):
        """A qmm_qmatrix borrowing the numpy arrays (the caller keeps them alive)."""
        return qmm_qmatrix(_u32ptr(w), _ptr(scales).value, _ptr(biases).value, dtype, rows, cols,
                           bits, group_size)

    def dequantize(self, w, scales, biases, dtype, bits, group_size, out_dtype):
        rows = w.shape[0]
        cols = w.shape[1] * 32 // bits
        arrays = [np.ascontiguousarray(a) for a in (w, scales, biases)]
        matrix = self.qmatrix(*arrays, dtype, rows, cols, bits, group_size)
        out = np.full((rows, cols), NAN_BITS[out_dtype], BITS_VIEW[out_dtype]).view(RAW_NUMPY[out_dtype])
        self.call("qmm_dequantize", ctypes.byref(matrix), _ptr(out), out_dtype)
        return out

    # ── the oracle

    def ref_qmm(self, w, scales, biases, dtype, bits, group_size, x_raw, transpose):
        """transpose=True: qmm_ref_qmm_t, W [N, K]; False: qmm_ref_qmm_n, W [K, N]. x_raw [M, K] raw."""
        rows = w.shape[0]
        cols = w.shape[1] * 32 // bits
        arrays = [np.ascontiguousarray(a) for a in (w, scales, biases)]
        matrix = self.qmatrix(*arrays, dtype, rows, cols, bits, group_size)
        x_raw = np.ascontiguousarray(x_raw)
        M = x_raw.shape[0]
        N = rows if transpose else cols
        out = np.full((M, N), NAN_BITS[dtype], BITS_VIEW[dtype]).view(RAW_NUMPY[dtype])
        name = "qmm_ref_qmm_t" if transpose else "qmm_ref_qmm_n"
        self.call(name, ctypes.byref(matrix), _ptr(x_raw), M, _ptr(out))
        return out

    def ref_dense_f64(self, w, scales, biases, dtype, bits, group_size, x_raw, transpose):
        rows = w.shape[0]
        cols = w.shape[1] * 32 // bits
        arrays = [np.ascontiguousarray(a) for a in (w, scales, biases)]
        matrix = self.qmatrix(*arrays, dtype, rows, cols, bits, group_size)
        x_raw = np.ascontiguousarray(x_raw)
        M = x_raw.shape[0]
        N = rows if transpose else cols
        exact = np.full((M, N), np.nan, np.float64)
        abs_dot = np.full((M, N), np.nan, np.float64)
        self.call("qmm_ref_dense_f64", ctypes.byref(matrix), _ptr(x_raw), M, 1 if transpose else 0,
                  exact.ctypes.data_as(POINTER(c_double)), abs_dot.ctypes.data_as(POINTER(c_double)))
        return exact, abs_dot

    # ── gather (MoE): w [E, N, K·bits/32], scales/biases [E, N, K/group_size], x [T, K], indices uint32 [B]

    @staticmethod
    def _indices(array):
        if array is None:
            return None, None
        array = np.ascontiguousarray(array, np.uint32)
        return array, array.ctypes.data_as(POINTER(c_uint32))

    def _stacked(self, w, scales, biases, dtype, bits, group_size):
        experts, N = w.shape[0], w.shape[1]
        arrays = [np.ascontiguousarray(a).reshape(experts * N, -1) for a in (w, scales, biases)]
        matrix = self.qmatrix(*arrays, dtype, experts * N, w.shape[2] * 32 // bits, bits, group_size)
        return arrays, matrix, experts, N

    def ref_gather(self, w, scales, biases, dtype, bits, group_size, x_raw, lhs, rhs):
        """qmm_ref_gather_qmm: out [B, N] raw (lhs None: row i of x)."""
        arrays, matrix, experts, N = self._stacked(w, scales, biases, dtype, bits, group_size)
        x_raw = np.ascontiguousarray(x_raw)
        (lhs_keep, lhs_ptr), (rhs_keep, rhs_ptr) = self._indices(lhs), self._indices(rhs)
        B = len(rhs_keep)
        out = np.full((B, N), NAN_BITS[dtype], BITS_VIEW[dtype]).view(RAW_NUMPY[dtype])
        self.call("qmm_ref_gather_qmm", ctypes.byref(matrix), experts, _ptr(x_raw), x_raw.shape[0], lhs_ptr,
                  rhs_ptr, B, _ptr(out))
        return out

    def ref_gather_dense_f64(self, w, scales, biases, dtype, bits, group_size, x_raw, lhs, rhs):
        arrays, matrix, experts, N = self._stacked(w, scales, biases, dtype, bits, group_size)
        x_raw = np.ascontiguousarray(x_raw)
        (lhs_keep, lhs_ptr), (rhs_keep, rhs_ptr) = self._indices(lhs), self._indices(rhs)
        B = len(rhs_keep)
        exact = np.full((B, N), np.nan, np.float64)
        abs_dot = np.full((B, N), np.nan, np.float64)
        self.call("qmm_ref_gather_dense_f64", ctypes.byref(matrix), experts, _ptr(x_raw), x_raw.shape[0], lhs_ptr,
                  rhs_ptr, B, exact.ctypes.data_as(POINTER(c_double)), abs_dot.ctypes.data_as(POINTER(c_double)))
        return exact, abs_dot

    def gather_kernels(self, backend):
        """(name, tolerance_slack) of the gather rows of a backend's table that can run on this machine
        (qmm_kernel_usable: not the AVX-512 rows on a CPU without it); [] when the backend cannot be created here."""
        context = c_void_p()
        if self.fn("qmm_context_create")(backend, 0, ctypes.byref(context)) != 0:
            return []
        try:
            names = []
            for i in range(self.fn("qmm_kernel_count")(context)):
                info = qmm_kernel_info()
                self.call("qmm_kernel_get", context, i, ctypes.byref(info))
                if info.op == QMM_OP_GATHER and self.fn("qmm_kernel_usable")(context, i, None) == 1:
                    names.append((info.name.decode(), info.tolerance_slack))
            return names
        finally:
            self.fn("qmm_context_destroy")(context)

    def gather_matmul(self, backend, kernel, w, scales, biases, dtype, bits, group_size, x_raw, lhs, rhs, sorted_indices):
        """qmm_gather_matmul through the runtime on `backend` with `kernel` forced; out [B, N] raw."""
        arrays, matrix, experts, N = self._stacked(w, scales, biases, dtype, bits, group_size)
        x_raw = np.ascontiguousarray(x_raw)
        T, K = x_raw.shape
        (lhs_keep, lhs_ptr), (rhs_keep, rhs_ptr) = self._indices(lhs), self._indices(rhs)
        B = len(rhs_keep)
        out = np.full((B, N), NAN_BITS[dtype], BITS_VIEW[dtype]).view(RAW_NUMPY[dtype])
        context, weights, xb, ob = c_void_p(), c_void_p(), c_void_p(), c_void_p()
        try:
            self.call("qmm_context_create", backend, 0, ctypes.byref(context))
            self.call("qmm_weights_create_experts", context, ctypes.byref(matrix), experts, ctypes.byref(weights))
            self.call("qmm_buffer_create", context, dtype, T * K, ctypes.byref(xb))
            self.call("qmm_buffer_create", context, dtype, B * N, ctypes.byref(ob))
            self.call("qmm_buffer_write", xb, _ptr(x_raw), T * K)
            self.call("qmm_buffer_poison", ob)
            options = qmm_gather_options(kernel.encode(), 1 if sorted_indices else 0, 0)
            info = qmm_kernel_info()
            self.call("qmm_gather_matmul", context, weights, xb, T, lhs_ptr, rhs_ptr, B, ob, ctypes.byref(options),
                      ctypes.byref(info))
            self.call("qmm_buffer_read", ob, _ptr(out), B * N)
            return out
        finally:
            for name, handle in (("qmm_buffer_destroy", ob), ("qmm_buffer_destroy", xb),
                                 ("qmm_weights_destroy", weights), ("qmm_context_destroy", context)):
                if handle:
                    self.fn(name)(handle)

    def error_bound(self, K, out_dtype, exact, abs_dot, slack):
        function = self.fn("qmm_error_bound")
        return np.vectorize(lambda e, a: function(K, out_dtype, float(e), float(a), float(slack)),
                            otypes=[np.float64])(exact, abs_dot)

    # ── GGUF

    def gguf_open(self, path):
        handle = c_void_p()
        self.call("qmm_gguf_open", path.encode(), ctypes.byref(handle))
        return handle

    def gguf_close(self, handle):
        self.fn("qmm_gguf_close")(handle)

    def gguf_tensor_count(self, handle):
        return self.fn("qmm_gguf_tensor_count")(handle)

    def gguf_tensor_info(self, handle, index):
        info = qmm_gguf_tensor_info()
        self.call("qmm_gguf_tensor_info_get", handle, index, ctypes.byref(info))
        return info

    def gguf_import(self, handle, index):
        """Returns ("quantized", dict) with copies of w/scales/biases and the format, or ("float",
        dict) with a copy of the data; the library's buffers are freed before returning."""
        is_quantized = c_int(-1)
        matrix = qmm_qmatrix()
        tensor = qmm_tensor()
        self.call("qmm_gguf_import", handle, index, ctypes.byref(is_quantized), ctypes.byref(matrix),
                  ctypes.byref(tensor))
        try:
            if is_quantized.value == 1:
                rows, cols, bits = matrix.rows, matrix.cols, matrix.bits
                groups = cols // matrix.group_size if matrix.group_size > 0 else 0
                words = cols * bits // 32
                raw = RAW_NUMPY.get(matrix.dtype, np.uint8)
                result = {
                    "dtype": matrix.dtype, "rows": rows, "cols": cols, "bits": bits,
                    "group_size": matrix.group_size,
                    "w": np.ctypeslib.as_array(matrix.w, shape=(rows * words,)).reshape(rows, words).copy(),
                    "scales": _copy_from(matrix.scales, raw, rows * groups).reshape(rows, groups),
                    "biases": _copy_from(matrix.biases, raw, rows * groups).reshape(rows, groups),
                }
                return "quantized", result
            if is_quantized.value == 0:
                shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
                data = ctypes.string_at(tensor.data, tensor.nbytes) if tensor.nbytes else b""
                return "float", {"dtype": tensor.dtype, "shape": shape, "data": data}
            raise QmmCallError(f"qmm_gguf_import returned OK but *is_quantized = {is_quantized.value}")
        finally:
            self.fn("qmm_gguf_import_free")(ctypes.byref(matrix), ctypes.byref(tensor))


def _copy_from(address, numpy_type, count):
    if not address or count == 0:
        return np.zeros(count, numpy_type)
    nbytes = count * np.dtype(numpy_type).itemsize
    return np.frombuffer(ctypes.string_at(address, nbytes), numpy_type).copy()
