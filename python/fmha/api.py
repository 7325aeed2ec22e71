"""api: fmha on NumPy arrays. `attention` and `attention_backward` take
[B, T, N, H] (or [T, N, H]) arrays, as jax.nn.dot_product_attention does,
check every shape and dtype in Python, describe the arrays to the C library
by pointer and element strides (broadcast views and permuted layouts need
no copies) and call fmha_forward / fmha_backward. Calls that name no
array besides the tensors run through plans kept per shape, strides and
options (fmha_plan_forward / fmha_plan_backward, a bounded cache).

Masks and biases broadcastable to [B, N, T, S] reach the C library as its
dense mask / dense bias with 0 strides on broadcast dimensions. Callbacks
(MaskCallback, BiasCallback) run Python on the library's threads, one tile
at a time; they are for experiments, not speed.
"""

import ctypes
import math
from collections import namedtuple

import numpy as np

from . import _lib, _spec
from ._lib import FmhaError

try:  # bfloat16 comes from ml_dtypes (optional)
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BFLOAT16 = None

_lib.load()  # ImportError with build instructions when libfmha.so is missing

__all__ = ["attention", "attention_backward", "describe", "quantize_kv", "MaskCallback", "BiasCallback", "Tile", "FmhaError",
           "DTYPE_CODES"]

DTYPE_CODES = {np.dtype(np.float32): _lib.DTYPE_F32, np.dtype(np.float16): _lib.DTYPE_F16}
if BFLOAT16 is not None:
    DTYPE_CODES[BFLOAT16] = _lib.DTYPE_BF16

CAUSAL_ALIGNMENTS = {"top_left": _spec.CAUSAL_TOP_LEFT, "bottom_right": _spec.CAUSAL_BOTTOM_RIGHT}

# scale +0.0 means "1/sqrt(head_dim)" to the C library; an explicit zero
# scale is passed as -0.0, which the library takes as given (a subnormal
# would read as 0 on threads that treat subnormals as zero, as XLA's do).
_ZERO_SCALE = -0.0

Tile = namedtuple("Tile", "batch head_q q0 nq k0 nk thread")


class MaskCallback:
    """A computed mask. fill(tile, visible) sets visible[i, r] = 0 for hidden
    scores of query tile.q0 + i and key tile.k0 + r (visible is a uint8
    [nq, nk] view of the library's buffer). classify(tile), optional, returns
    0 (every score hidden), 1 (none hidden) or 2 (ask fill)."""

    def __init__(self, fill, classify=None):
        self.fill = fill
        self.classify = classify


class BiasCallback:
    """A computed bias. fill(tile, scores) adds to the float32 [nq, nk] view
    scores; accumulate_grad(tile, d_scores), optional, receives the tile's
    gradient of the loss with respect to the added bias."""

    def __init__(self, fill, accumulate_grad=None):
        self.fill = fill
        self.accumulate_grad = accumulate_grad


# ---- helpers shared with the torch binding --------------------------------------------

def dtype_code(dtype, name=None, from_list=False):
    """The fmha_dtype of a NumPy dtype; TypeError (naming the argument) for others."""
    dtype = np.dtype(dtype)
    if dtype not in DTYPE_CODES:
        names = ", ".join(str(d) for d in DTYPE_CODES)
        what = f"{name} has dtype {dtype}" if name else f"unsupported dtype {dtype}"
        hint = " (a Python list becomes a float64 array: pass np.asarray(x, np.float32))" if from_list else ""
        raise TypeError(f"fmha: {what}{hint}; use one of {names}")
    return DTYPE_CODES[dtype]


KV_DTYPE_RULE = ("query, key and value must share a dtype (or key and value one of their own, bfloat16 or float16, "
                 "beside float32 query)")


def kv_dtype_code(code, k_code, v_code):
    """fmha_kv_dtype of key and value (fmha_dtype codes) beside a query of
    code `code`: 0 when they share it, the cache's dtype + 1 for bf16 or f16
    beside float32; None for a mix the library does not serve (KV_DTYPE_RULE)."""
    if k_code != v_code or (k_code != code and code != _lib.DTYPE_F32):
        return None
    return 0 if k_code == code else k_code + 1


def forward_only_error(paged, q_dtype, kv_dtype, context, remedy):
    """The FmhaError (FMHA_ERR_UNSUPPORTED) for differentiating a call that
    fmha serves forward only (a paged cache, a cache dtype other than the
    query's); None for other calls."""
    if paged:
        why = "a paged KV cache (block_table)"
    elif kv_dtype != q_dtype:
        why = f"a key/value cache dtype ({kv_dtype}) other than the query's ({q_dtype})"
    else:
        return None
    return FmhaError(_lib.ERR_UNSUPPORTED, f"{why} is forward only: fmha has no backward for it, so it cannot be "
                     f"differentiated ({remedy})", context)


def broadcast_strides(shape, strides, full, name, given=None):
    """Element strides of a 4-D operand broadcast to `full` ([B, N, T, S]):
    0 where the operand has size 1. ValueError when a size is neither 1 nor
    the full size, naming the caller's own shape (`given`, before it was
    padded to 4-D) and its dimension."""
    if len(shape) != 4:
        raise ValueError(f"fmha: {name} must have at most 4 dimensions, got shape {tuple(shape)}")
    given = tuple(shape) if given is None else tuple(given)
    out = []
    for i, (n, st, f) in enumerate(zip(shape, strides, full)):
        if n == 1:
            out.append(0)
        elif n == f:
            out.append(int(st))
        else:
            raise ValueError(f"fmha: {name} of shape {given} does not broadcast to "
                             f"[B, N, T, S] = {list(full)} (its dimension {i - (4 - len(given))})")
    return out


def window_sides(local_window_size):
    """(left, right) for the C struct, -1 leaving a side unbounded. Takes an
    int (both sides) or a (left, right) tuple whose sides are ints >= 0, or
    None or -1 for an unbounded side (FlashAttention's window_size spelling)."""
    def side(x):
        if x is None:
            return -1
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"fmha: local_window_size must be an int or a (left, right) tuple of ints, got "
                            f"{local_window_size!r}")
        if x < -1 or x > 2**63 - 1:
            raise ValueError(f"fmha: local_window_size sides must lie in 0..2**63 - 1 (or -1 / None: unbounded), "
                             f"got {local_window_size!r}")
        return int(x)

    if local_window_size is None:
        return -1, -1
    if isinstance(local_window_size, (tuple, list)):
        if len(local_window_size) != 2:
            raise TypeError(f"fmha: local_window_size tuple must be (left, right), got {local_window_size!r}")
        return side(local_window_size[0]), side(local_window_size[1])
    w = side(local_window_size)
    return w, w


def resolve_scale(scale, head_dim):
    if scale is None:
        if head_dim < 1:
            raise ValueError(f"fmha: the head dim must be at least 1, got {head_dim}")
        return 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"fmha: scale must be finite, got {scale}")
    if abs(scale) > float(np.finfo(np.float32).max):
        raise ValueError(f"fmha: scale must be a finite float32 (|scale| <= {float(np.finfo(np.float32).max):.4g}), "
                         f"got {scale}")
    return _ZERO_SCALE if scale == 0.0 else scale


def strategy_code(strategy):
    if strategy not in _lib.STRATEGIES:
        raise ValueError(f"fmha: unknown strategy {strategy!r}; use one of {sorted(_lib.STRATEGIES)}")
    return _lib.STRATEGIES[strategy]


def causal_code(is_causal, causal_alignment):
    """The bindings' causal code: an fmha_causal value, or
    CAUSAL_NONE_BOTTOM_RIGHT (no causal mask; windows, ALiBi and the
    relative table still measured bottom-right, as FlashAttention does)."""
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"fmha: causal_alignment must be 'top_left' or 'bottom_right', got "
                         f"{causal_alignment!r}")
    if is_causal:
        return CAUSAL_ALIGNMENTS[causal_alignment]
    return _spec.CAUSAL_NONE if causal_alignment == "top_left" else _spec.CAUSAL_NONE_BOTTOM_RIGHT


def causal_fields(code):
    """(fmha_problem.causal, fmha_problem.alignment) of a causal code."""
    if code == _spec.CAUSAL_NONE_BOTTOM_RIGHT:
        return _spec.CAUSAL_NONE, _lib.ALIGN_BOTTOM_RIGHT
    return code, _lib.ALIGN_CAUSAL


# fmha_precision values (fmha.h): "bf16x3" and "bf16" are float32's on a
# matrix engine (AMX tiles); bf16 problems read them as accurate and fast
PRECISIONS = {"accurate": 0, "fast": 1, "bf16x3": 2, "bf16": 3}


def precision_code(precision, default="fast", context="fmha"):
    """The fmha_precision code of a precision name; None takes `default`
    (fast, or what a binding reads from its framework's float32 matmul
    setting)."""
    name = default if precision is None else precision
    if name not in PRECISIONS:
        raise ValueError(f"{context}: unknown precision {name!r}; use one of {sorted(PRECISIONS)}")
    return PRECISIONS[name]


def new_problem(dtype, sizes, q_strides, k_strides, v_strides, o_strides, *, scale, causal,
                strategy, window=(-1, -1)):
    """An fmha_problem from sizes (B, Hq, Hkv, Sq, Skv, D, Dv) and [b, s, h, d] strides."""
    p = _lib.problem_init(*sizes)
    p.dtype = dtype
    p.scale = scale
    p.causal, p.alignment = causal_fields(causal)
    p.strategy = strategy
    for field, st in (("q_strides", q_strides), ("k_strides", k_strides), ("v_strides", v_strides),
                      ("o_strides", o_strides)):
        getattr(p, field)[:] = [int(x) for x in st]
    p.masks.window_left, p.masks.window_right = window
    return p


def _ptr(ctype, address):
    return ctypes.cast(ctypes.c_void_p(address), ctypes.POINTER(ctype))


def set_dense_mask(p, address, strides):
    p.masks.dense = _ptr(ctypes.c_uint8, address)
    p.masks.dense_strides[:] = strides


def set_dense_bias(p, address, strides):
    p.biases.dense = _ptr(ctypes.c_float, address)
    p.biases.dense_strides[:] = strides


def set_extras(p, *, q_lengths=None, kv_lengths=None, q_ids=None, kv_ids=None, alibi=None, rel_table=None,
               rel_num_buckets=0, rel_max_distance=128, rel_bidirectional=True, softcap=None, sinks=None):
    """Points p at the optional int32 / float32 arrays given by address
    (None = off): lengths [B], segment ids [B, T] / [B, S], alibi slopes
    [N], rel_table [N, rel_num_buckets], sinks [N]; softcap None = off."""
    if q_lengths is not None:
        p.masks.q_lengths = _ptr(ctypes.c_int32, q_lengths)
    if kv_lengths is not None:
        p.masks.kv_lengths = _ptr(ctypes.c_int32, kv_lengths)
    if q_ids is not None:
        p.masks.q_segment_ids = _ptr(ctypes.c_int32, q_ids)
        p.masks.kv_segment_ids = _ptr(ctypes.c_int32, kv_ids)
    if alibi is not None:
        p.biases.alibi_slopes = _ptr(ctypes.c_float, alibi)
    if rel_table is not None:
        p.biases.rel_table = _ptr(ctypes.c_float, rel_table)
        p.biases.rel_num_buckets = int(rel_num_buckets)
        p.biases.rel_max_distance = int(rel_max_distance)
        p.biases.rel_bidirectional = int(bool(rel_bidirectional))
    if softcap is not None:
        p.biases.softcap = softcap
    if sinks is not None:
        p.sinks = _ptr(ctypes.c_float, sinks)


def softcap_value(softcap):
    """softcap as a float (None = off); ValueError unless > 0 and finite."""
    if softcap is None:
        return None
    softcap = float(softcap)
    if not (softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"fmha: softcap must be > 0 and finite, got {softcap}")
    return softcap


# ---- NumPy operands ------------------------------------------------------------------------

def _elem_strides(a):
    """Element strides; a negative one on a length-1 axis (a flipped axis
    NumPy still calls contiguous) becomes 0, since no element uses it."""
    return tuple(0 if n == 1 and s < 0 else s // a.itemsize for s, n in zip(a.strides, a.shape))


def _usable(a):
    """a itself when the library can read it in place, else a contiguous copy."""
    if a.flags.aligned and all((s >= 0 or n == 1) and s % a.itemsize == 0 for s, n in zip(a.strides, a.shape)):
        return a
    return np.ascontiguousarray(a)


def _as_array(x, name):
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array__") or isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(f"fmha: {name} must be a NumPy array, got {type(x).__name__}")


def _bshd(a):
    """[b, s, h, d] element strides of a [B, T, N, H] array."""
    return _elem_strides(a)


def _int32_vector(x, length, upper, name):
    x = _as_array(x, name)
    if x.dtype.kind not in "iu":
        raise TypeError(f"fmha: {name} must hold integers, got dtype {x.dtype}")
    if x.shape != (length,):
        raise ValueError(f"fmha: {name} must have shape ({length},), got {x.shape}")
    if x.size and (x.min() < 0 or x.max() > upper):
        raise ValueError(f"fmha: {name} must lie in 0..{upper}, got {x.min()}..{x.max()}")
    return np.ascontiguousarray(x, dtype=np.int32)


def _int32_matrix(x, shape, name):
    """x as int32 of `shape`; its values checked against int32's range before
    the cast (a wider integer is never wrapped)."""
    x = _as_array(x, name)
    if x.dtype.kind not in "iu":
        raise TypeError(f"fmha: {name} must hold integers, got dtype {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"fmha: {name} must have shape {shape}, got {x.shape}")
    if x.size and x.dtype.itemsize * 8 - (x.dtype.kind == "u") > 31:
        lo, hi = int(x.min()), int(x.max())
        if lo < _spec.INT32_MIN or hi > _spec.INT32_MAX:
            raise ValueError(f"fmha: {name} must lie in int32's range -2**31..2**31 - 1, got {lo}..{hi}")
    return np.ascontiguousarray(x, dtype=np.int32)


def block_table_array(x, batch):
    """A block table as a contiguous int32 [batch, max_pages] array;
    ValueError / TypeError for another shape or a non-integer dtype."""
    table = _as_array(x, "block_table")
    if table.ndim != 2 or table.shape[0] != batch or table.shape[1] < 1:
        raise ValueError(f"fmha: block_table must be [B, max_pages] = [{batch}, >= 1], got {table.shape}")
    return _int32_matrix(table, table.shape, "block_table")


def _float32_tensor(x, name):
    x = _as_array(x, name)
    if x.dtype.kind not in "fiub" and x.dtype != BFLOAT16:
        raise TypeError(f"fmha: {name} must be a real array, got dtype {x.dtype}")
    return x if x.dtype == np.float32 else x.astype(np.float32)


def _to_4d(x, batched):
    """Left-pads a mask or bias with size-1 dimensions to 4-D."""
    if x.ndim > 4:
        raise ValueError(f"fmha: mask and bias must broadcast to {'[B, N, T, S]' if batched else '[N, T, S]'}"
                         f", got shape {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)


class _Call:
    """One prepared C call: the problem and every buffer it points at (kept
    alive here until the call returns)."""

    def __init__(self):
        self.keep = []
        self.callback_error = None
        self.bias4 = None       # float32 [.., .., .., ..] as passed to C
        self.bias_shape = None  # the caller's shape
        self.alibi = None
        self.rel_table = None
        self.sinks = None

    def hold(self, *objects):
        self.keep.extend(objects)

    def record_error(self, exc):
        if self.callback_error is None:
            self.callback_error = exc

    def raise_callback_error(self):
        if self.callback_error is not None:
            err, self.callback_error = self.callback_error, None
            raise err


def _tile_view(tile_ptr, buffer_ptr, ctype, dtype):
    t = tile_ptr.contents
    nq, nk = int(t.nq), int(t.nk)
    qs, ks = int(t.q_stride), int(t.k_stride)
    extent = (nq - 1) * qs + (nk - 1) * ks + 1 if nq and nk else 0
    flat = np.ctypeslib.as_array(ctypes.cast(buffer_ptr, ctypes.POINTER(ctype)), shape=(max(extent, 1),))
    itemsize = np.dtype(dtype).itemsize
    view = np.lib.stride_tricks.as_strided(flat, shape=(nq, nk), strides=(qs * itemsize, ks * itemsize))
    return Tile(int(t.batch), int(t.head_q), int(t.q0), nq, int(t.k0), nk, int(t.thread)), view


def _install_mask_callback(p, call, cb):
    if not isinstance(cb, MaskCallback):
        if callable(cb):
            cb = MaskCallback(cb)
        else:
            raise TypeError("fmha: mask_callback must be a MaskCallback or a fill function")

    def fill(ctx, tile_ptr, visible_ptr):
        try:
            tile, view = _tile_view(tile_ptr, visible_ptr, ctypes.c_uint8, np.uint8)
            cb.fill(tile, view)
        except BaseException as e:  # noqa: BLE001 - re-raised after the C call
            call.record_error(e)

    def classify(ctx, tile_ptr):
        try:
            t = tile_ptr.contents
            tile = Tile(int(t.batch), int(t.head_q), int(t.q0), int(t.nq), int(t.k0), int(t.nk),
                        int(t.thread))
            return int(cb.classify(tile))
        except BaseException as e:  # noqa: BLE001
            call.record_error(e)
            return -1  # an invalid class: the library stops with FMHA_ERR_CALLBACK

    c_fill = _lib.MASK_FILL_FN(fill)
    p.masks.callback.fill = c_fill
    call.hold(c_fill)
    if cb.classify is not None:
        c_classify = _lib.MASK_CLASSIFY_FN(classify)
        p.masks.callback.classify = c_classify
        call.hold(c_classify)


def _install_bias_callback(p, call, cb):
    if not isinstance(cb, BiasCallback):
        if callable(cb):
            cb = BiasCallback(cb)
        else:
            raise TypeError("fmha: bias_callback must be a BiasCallback or a fill function")

    def fill(ctx, tile_ptr, scores_ptr):
        try:
            tile, view = _tile_view(tile_ptr, scores_ptr, ctypes.c_float, np.float32)
            cb.fill(tile, view)
        except BaseException as e:  # noqa: BLE001
            call.record_error(e)

    def accumulate(ctx, tile_ptr, grad_ptr):
        try:
            tile, view = _tile_view(tile_ptr, grad_ptr, ctypes.c_float, np.float32)
            cb.accumulate_grad(tile, view)
        except BaseException as e:  # noqa: BLE001
            call.record_error(e)

    c_fill = _lib.BIAS_FILL_FN(fill)
    p.biases.callback.fill = c_fill
    call.hold(c_fill)
    if cb.accumulate_grad is not None:
        c_acc = _lib.BIAS_GRAD_FN(accumulate)
        p.biases.callback.accumulate_grad = c_acc
        call.hold(c_acc)


def _stored(x, fmt, name, from_list):
    """(array, fmha_kv_format code, head dim) of a key or value stored in
    format fmt (None: its own dtype, float32 / bfloat16 / float16)."""
    if fmt is None:
        return x, dtype_code(x.dtype, name, from_list) + 1, x.shape[-1]
    if fmt not in _spec.KV_FORMATS:
        raise ValueError(f"fmha: {name}_format must be one of {sorted(_spec.KV_FORMATS)} (or None), got {fmt!r}")
    code, _, per, nbytes = _spec.KV_FORMATS[fmt]
    if fmt == "int8":
        if x.dtype != np.int8:
            raise TypeError(f"fmha: {name} of {name}_format 'int8' must be an int8 array, got {x.dtype}")
    elif x.dtype.itemsize == 1 and x.dtype.kind in "uV" or x.dtype.name.startswith("float8"):
        x = x.view(np.uint8)  # fp8 bits, or ml_dtypes float8 arrays
    else:
        raise TypeError(f"fmha: {name} of {name}_format {fmt!r} must be uint8 (or an ml_dtypes float8 array), "
                        f"got {x.dtype}")
    dim = _spec.kv_format_head_dim(fmt, x.shape[-1])
    if dim is None:
        raise ValueError(f"fmha: {name} of {name}_format {fmt!r} holds blocks of {per} values in {nbytes} bytes: its "
                         f"last dim must be a multiple of {nbytes} (head dim / {per} x {nbytes}), got {x.shape[-1]}")
    return x, code, dim


def _format_scales(x, code, pool, K, name, paged):
    """The float32 scales of a format (code) or None; pool = the leading
    extents of the cache ([B, S], or [P, page] paged)."""
    kind = next((v[1] for v in _spec.KV_FORMATS.values() if v[0] == code), None)
    fmt = next((n for n, v in _spec.KV_FORMATS.items() if v[0] == code), None)
    if kind is None:
        if x is not None:
            why = "its scales are in its blocks" if fmt else "it has no scales"
            raise ValueError(f"fmha: {name} must be None for {fmt or 'a float'} cache ({why})")
        return None
    if x is None:
        if kind == "key":
            raise ValueError(f"fmha: {name} must be given for format {fmt!r}: float32 [{pool[0]}, {pool[1]}, {K}] "
                             f"({'pages, page size' if paged else 'B, S'}, kv heads)")
        return None
    sc = _float32_tensor(_as_array(x, name), name)
    want = (pool[0], pool[1], K) if kind == "key" else (K,)
    if sc.shape != want:
        raise ValueError(f"fmha: {name} of format {fmt!r} must have shape {want}, got {sc.shape}")
    return _usable(sc)


def _scale_strides(sc):
    """fmha_problem's scale strides [batch or page, key, head] of an array."""
    st = _elem_strides(sc)
    return st if len(st) == 3 else (0, 0, st[0])


def quantize_kv(x, format, scales=None):
    """Writes float rows into a quantized KV-cache format (fmha_kv_quantize):
    x [..., K, H] (e.g. [B, S, K, H] or a page pool [P, page, K, H]), any
    real dtype (taken as float32). Returns (values, scales) in the forms
    attention's key_format / value_format read:
      "int8"      int8 [..., K, H] and float32 scales [..., K] (max |x| / 127
                  per row; q = round(x / scale))
      "fp8_e4m3", "fp8_e5m2"
                  uint8 bits [..., K, H] and float32 scales [K]: given (to
                  append to a cache), or max |x| of each head / the format's
                  largest value (448, 57344); round to nearest even, saturated
      "q8_0", "q4_0"
                  uint8 [..., K, H / 32 * 34] / [..., K, H / 32 * 18] (GGUF
                  blocks, bit for bit ggml's reference quantizers) and None
    """
    if format not in _spec.KV_FORMATS:
        raise ValueError(f"fmha: format must be one of {sorted(_spec.KV_FORMATS)}, got {format!r}")
    a = np.ascontiguousarray(_float32_tensor(_as_array(x, "x"), "x"))
    if a.ndim < 2 or 0 in a.shape:
        raise ValueError(f"fmha: x must be [..., K, H] with no empty dim, got shape {a.shape}")
    code, kind, per, nbytes = _spec.KV_FORMATS[format]
    *lead, K, H = a.shape
    if H % per:
        raise ValueError(f"fmha: {format} needs a head dim that is a multiple of {per}, got {H}")
    tokens = int(np.prod(lead)) if lead else 1
    row = H // per * nbytes
    values = np.empty((*lead, K, row), np.int8 if format == "int8" else np.uint8)
    out_scales = None
    if kind == "key":
        if scales is not None:
            raise ValueError("fmha: int8 computes its scales (one per row): pass scales=None")
        out_scales = np.empty((*lead, K), np.float32)
        sc_strides = (K, 1)
    elif kind == "head":
        if scales is None:
            amax = np.abs(a.reshape(tokens, K, H)).max(axis=(0, 2))
            out_scales = (amax / _spec.KV_FORMAT_TOP[format]).astype(np.float32)
            out_scales[out_scales == 0] = 1.0  # a zero head: any positive scale
        else:
            out_scales = np.ascontiguousarray(_float32_tensor(_as_array(scales, "scales"), "scales"))
            if out_scales.shape != (K,):
                raise ValueError(f"fmha: scales of {format} must have shape ({K},) (one per kv head), got "
                                 f"{out_scales.shape}")
        sc_strides = (0, 1)
    elif scales is not None:
        raise ValueError(f"fmha: {format} keeps its scales in its blocks: pass scales=None")
    I64 = ctypes.c_int64 * 3
    status = _lib.load().fmha_kv_quantize(
        code, tokens, K, H, a.ctypes.data, I64(K * H, H, 1), values.ctypes.data, I64(K * row, row, 1),
        out_scales.ctypes.data if out_scales is not None else None,
        (ctypes.c_int64 * 2)(*sc_strides) if out_scales is not None else None)
    _lib.check(status, "fmha_kv_quantize")
    return values, out_scales


def _prepare(query, key, value, bias, mask, *, scale, is_causal, causal_alignment, local_window_size,
             query_seq_lengths, key_value_seq_lengths, segment_ids, alibi_slopes, rel_table,
             rel_max_distance, rel_bidirectional, softcap, strategy, mask_callback, bias_callback,
             precision=None, sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
             block_table=None, key_format=None, value_format=None, key_scales=None, value_scales=None):
    """Validates every argument (ValueError / TypeError) without calling the
    library; returns (call, q, k, v, batched) for _describe."""
    q = _as_array(query, "query")
    k = _as_array(key, "key")
    v = _as_array(value, "value")
    if q.ndim != k.ndim or q.ndim != v.ndim or q.ndim not in (3, 4):
        raise ValueError("fmha: query, key and value must all be [B, T, N, H] (4-D) or [T, N, H] (3-D), "
                         f"got shapes {q.shape}, {k.shape}, {v.shape}")
    lists = [not isinstance(x, np.ndarray) for x in (query, key, value)]
    code = dtype_code(q.dtype, "query", lists[0])
    formats = None
    if key_format is None and value_format is None:
        kv_code = kv_dtype_code(code, dtype_code(k.dtype, "key", lists[1]),
                                dtype_code(v.dtype, "value", lists[2]))  # 0 = the query's dtype
        if kv_code is None:
            raise TypeError(f"fmha: {KV_DTYPE_RULE}, got {q.dtype}, {k.dtype}, {v.dtype}")
        if key_scales is not None or value_scales is not None:
            raise ValueError("fmha: key_scales and value_scales need key_format / value_format")
    else:  # K and V each in its storage format (fmha_problem.k_format / v_format)
        kv_code = 0
        k, k_fmt, k_dim = _stored(k, key_format, "key", lists[1])
        v, v_fmt, v_dim = _stored(v, value_format, "value", lists[2])
        formats = (k_fmt, v_fmt, k_dim, v_dim)
    batched = q.ndim == 4
    if block_table is not None and not batched:
        raise ValueError("fmha: block_table needs 4-D query [B, T, N, H] and page pools [P, page, K, H]")
    if not batched:
        q, k, v = q[None], k[None], v[None]
    B, T, N, H = q.shape
    Bk, S, K, Hk = k.shape
    Hv = v.shape[3]
    if formats is not None:  # the head dims the stored rows hold
        Hk, Hv = formats[2], formats[3]
    table = None
    if block_table is not None:  # k, v: page pools [num_pages, page_size, K, H]
        table = block_table_array(block_table, B)
        if key_value_seq_lengths is None:
            raise ValueError("fmha: block_table needs key_value_seq_lengths (the keys each sequence holds)")
        if v.shape[0] != Bk:
            raise ValueError(f"fmha: key and value pools must hold the same pages, got {k.shape}, {v.shape}")
        Bk, S = B, table.shape[1] * k.shape[1]  # a sequence holds up to max_pages * page_size keys
    if table is None and (Bk != B or v.shape[0] != B):
        raise ValueError(f"fmha: query, key and value must share the batch size, got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if Hk != H:
        raise ValueError(f"fmha: query and key must share the head dim, got {H} and {Hk}")
    if v.shape[1] != k.shape[1] or v.shape[2] != K:
        raise ValueError(f"fmha: value must be [B, S, K, Hv] like key {k.shape}, got {v.shape}")
    if K == 0 or N % K != 0:
        raise ValueError(f"fmha: the number of query heads must be a multiple of key/value heads, got "
                         f"{N} vs {K}")
    q, k, v = _usable(q), _usable(k), _usable(v)
    full = (B, N, T, S)
    scale_value = resolve_scale(scale, H)
    causal = causal_code(is_causal, causal_alignment)
    strategy_value = strategy_code(strategy)
    precision_value = precision_code(precision)
    window = window_sides(local_window_size)

    call = _Call()
    call.shape = (B, T, N, S, K, H, Hv)
    m = b = ql = kl = q_ids = kv_ids = a = r = z = None
    if mask is not None:
        m = _as_array(mask, "mask")
        if m.dtype == np.bool_:
            m = m.view(np.uint8)
        elif m.dtype.kind in "iu":
            m = (m != 0).view(np.uint8)
        else:
            raise TypeError(f"fmha: mask must be boolean (True = attend), got dtype {m.dtype}; pass additive "
                            "masks as bias")
        given = m.shape
        m = _usable(_to_4d(m, batched))
        mask_strides = broadcast_strides(m.shape, _elem_strides(m), full, "mask", given=given)
    if bias is not None:
        b = _as_array(bias, "bias")
        call.bias_shape = b.shape
        b = _usable(_to_4d(_float32_tensor(b, "bias"), batched))
        bias_strides = broadcast_strides(b.shape, _elem_strides(b), full, "bias", given=call.bias_shape)
        call.bias4 = b
    def lengths(x, upper, name):
        """A length per batch element; unbatched inputs take one (a scalar or [1])."""
        x = _as_array(np.asarray(x) if np.isscalar(x) else x, name)
        if not batched:
            if x.size != 1:
                raise ValueError(f"fmha: {name} of unbatched (3-D) inputs must be one length, got shape {x.shape}")
            x = x.reshape(1)
        return _int32_vector(x, B, upper, name)

    if query_seq_lengths is not None:
        ql = lengths(query_seq_lengths, T, "query_seq_lengths")
    if key_value_seq_lengths is not None:
        kl = lengths(key_value_seq_lengths, S, "key_value_seq_lengths")
    if segment_ids is not None:
        if isinstance(segment_ids, (tuple, list)) and len(segment_ids) == 2:
            q_ids, kv_ids = segment_ids
        else:
            if T != S:
                raise ValueError("fmha: one segment_ids array needs T == S; pass (q_segment_ids, "
                                 "kv_segment_ids) otherwise")
            q_ids = kv_ids = segment_ids
        q_ids = _as_array(q_ids, "segment_ids")
        kv_ids = _as_array(kv_ids, "segment_ids")
        if not batched:
            q_ids, kv_ids = q_ids[None], kv_ids[None]
        q_ids = _int32_matrix(q_ids, (B, T), "q_segment_ids")
        kv_ids = _int32_matrix(kv_ids, (B, S), "kv_segment_ids")
    if alibi_slopes is not None:
        a = _float32_tensor(alibi_slopes, "alibi_slopes")
        if a.shape != (N,):
            raise ValueError(f"fmha: alibi_slopes must have shape ({N},) (one per query head), got {a.shape}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"fmha: alibi_slopes must be finite, got {a[~np.isfinite(a)][0]} at head "
                             f"{int(np.flatnonzero(~np.isfinite(a))[0])}")
        call.alibi = a = np.ascontiguousarray(a)
    if rel_table is not None:
        r = _float32_tensor(rel_table, "rel_table")
        if r.ndim != 2 or r.shape[0] != N or r.shape[1] < 1:
            raise ValueError(f"fmha: rel_table must have shape ({N}, num_buckets), got {r.shape}")
        if r.shape[1] > 2**31 - 1:
            raise ValueError(f"fmha: rel_table may have at most 2**31 - 1 buckets, got {r.shape[1]}")
        call.rel_table = r = np.ascontiguousarray(r)
    if isinstance(rel_max_distance, bool) or not isinstance(rel_max_distance, (int, np.integer)):
        raise TypeError(f"fmha: rel_max_distance must be an int, got {rel_max_distance!r}")
    if not 1 <= rel_max_distance <= 2**31 - 1:
        raise ValueError(f"fmha: rel_max_distance must lie in 1..2**31 - 1, got {rel_max_distance}")
    if not isinstance(rel_bidirectional, (bool, np.bool_)) and rel_bidirectional not in (0, 1):
        raise ValueError(f"fmha: rel_bidirectional must be a bool, got {rel_bidirectional!r}")
    dropout_p = float(dropout_p)
    if not (0.0 <= dropout_p < 1.0):
        raise ValueError(f"fmha: dropout_p must be in [0, 1), got {dropout_p}")
    for name, value in (("dropout_seed", dropout_seed), ("dropout_offset", dropout_offset)):
        if not (isinstance(value, (int, np.integer)) and 0 <= int(value) < _spec.DROPOUT_COUNTER_LIMIT):
            raise ValueError(f"fmha: {name} must be an integer in [0, 2**64), got {value!r}")
    if sinks is not None:
        z = _float32_tensor(sinks, "sinks")
        if z.shape != (N,):
            raise ValueError(f"fmha: sinks must have shape ({N},) (one logit per query head), got {z.shape}")
        if not np.all(np.isfinite(z)):
            raise ValueError("fmha: sinks must be finite")
        call.sinks = z = np.ascontiguousarray(z)
    softcap = softcap_value(softcap)
    scales = (None, None)
    if formats is not None:
        pool = (k.shape[0], k.shape[1]) if table is not None else (B, S)
        scales = tuple(_format_scales(x, formats[i], pool, K, name, table is not None)
                       for i, (x, name) in enumerate(((key_scales, "key_scales"), (value_scales, "value_scales"))))
    if mask_callback is not None and not (isinstance(mask_callback, MaskCallback) or callable(mask_callback)):
        raise TypeError("fmha: mask_callback must be a MaskCallback or a fill function")
    if bias_callback is not None and not (isinstance(bias_callback, BiasCallback) or callable(bias_callback)):
        raise TypeError("fmha: bias_callback must be a BiasCallback or a fill function")

    call.parts = dict(code=code, kv_code=kv_code, block_table=table, pool=k.shape[:2], sizes=(B, N, K, T, S, H, Hv), scale=scale_value, causal=causal,
                      strategy=strategy_value, precision=precision_value, window=window, mask=m,
                      bias=b, q_lengths=ql, kv_lengths=kl,
                      q_ids=q_ids, kv_ids=kv_ids, alibi=a, rel_table=r, sinks=z, softcap=softcap,
                      dropout=(dropout_p, int(dropout_seed), int(dropout_offset)),
                      rel_max_distance=rel_max_distance, rel_bidirectional=rel_bidirectional,
                      mask_strides=mask_strides if m is not None else None,
                      bias_strides=bias_strides if b is not None else None,
                      mask_callback=mask_callback, bias_callback=bias_callback, formats=formats,
                      key_scales=scales[0], value_scales=scales[1])
    return call, q, k, v, batched


def _describe(call, q, k, v):
    """The C problem of a validated call (the first C call of an entry point)."""
    d = call.parts
    B, N, K, T, S, H, Hv = d["sizes"]
    p = new_problem(d["code"], d["sizes"], _bshd(q), _bshd(k), _bshd(v), (T * N * Hv, N * Hv, Hv, 1),
                    scale=d["scale"], causal=d["causal"], strategy=d["strategy"], window=d["window"])
    p.precision = d["precision"]
    m, b, ql, kl, q_ids, kv_ids, a, r = (d[x] for x in ("mask", "bias", "q_lengths", "kv_lengths", "q_ids",
                                                         "kv_ids", "alibi", "rel_table"))
    if m is not None:
        set_dense_mask(p, m.ctypes.data, d["mask_strides"])
    if b is not None:
        set_dense_bias(p, b.ctypes.data, d["bias_strides"])
    def address(a):
        return None if a is None else a.ctypes.data

    set_extras(p, q_lengths=address(ql), kv_lengths=address(kl), q_ids=address(q_ids), kv_ids=address(kv_ids),
               alibi=address(a), rel_table=address(r), rel_num_buckets=r.shape[1] if r is not None else 0,
               rel_max_distance=d["rel_max_distance"], rel_bidirectional=d["rel_bidirectional"],
               softcap=d["softcap"], sinks=address(d["sinks"]))
    p.dropout_p, p.dropout_seed, p.dropout_offset = d["dropout"]
    p.kv_dtype = d["kv_code"]
    if d["formats"] is not None:
        p.k_format, p.v_format = d["formats"][:2]
        for i, name in enumerate(("key_scales", "value_scales")):
            sc = d[name]
            if sc is not None:
                setattr(p, ("k_scales", "v_scales")[i], _ptr(ctypes.c_float, sc.ctypes.data))
                getattr(p, ("k_scale_strides", "v_scale_strides")[i])[:] = _scale_strides(sc)
    table = d["block_table"]
    if table is not None:
        p.block_table = _ptr(ctypes.c_int32, table.ctypes.data)
        p.block_table_stride = table.shape[1]
        p.num_pages, p.page_size = d["pool"]
    call.hold(m, b, ql, kl, q_ids, kv_ids, a, r, d["sinks"], table, d["key_scales"], d["value_scales"])
    if d["mask_callback"] is not None:
        _install_mask_callback(p, call, d["mask_callback"])
    if d["bias_callback"] is not None:
        _install_bias_callback(p, call, d["bias_callback"])
    call.problem = p


# Plans of the calls that name no array but the tensors (no mask, bias,
# lengths, segment ids, slopes, table or callback): those arrays are new on
# every call, so such calls take the one-shot path instead.
_PLANS = _lib.PlanCache(32)
_PER_CALL_PARTS = ("mask", "bias", "q_lengths", "kv_lengths", "q_ids", "kv_ids", "alibi", "rel_table",
                   "sinks", "mask_callback", "bias_callback", "block_table", "key_scales", "value_scales")


def _cached_plan(call, q, k, v, o_strides):
    """The cached plan of a validated call, or None when it names per-call arrays."""
    d = call.parts
    for name in _PER_CALL_PARTS:
        if d[name] is not None:
            return None
    o_strides = tuple(o_strides)
    key = (d["code"], d["kv_code"], d["formats"], d["sizes"], _bshd(q), _bshd(k), _bshd(v), o_strides, d["scale"], d["causal"],
           d["strategy"], d["precision"], d["window"], d["softcap"], d["dropout"])

    def make_problem():
        _describe(call, q, k, v)
        call.problem.o_strides[:] = o_strides
        return call.problem

    return _PLANS.get(key, make_problem)


def _run(call, fn, *args):
    lib = _lib.load()
    status = getattr(lib, fn)(ctypes.byref(call.problem), *args)
    if status == _lib.ERR_CALLBACK or call.callback_error is not None:
        call.raise_callback_error()
    _lib.check(status, fn)


def _address(a):
    return ctypes.c_void_p(a.ctypes.data) if a is not None else None


def attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
              causal_alignment="top_left", local_window_size=None, query_seq_lengths=None,
              key_value_seq_lengths=None, segment_ids=None, alibi_slopes=None, softcap=None,
              rel_table=None, rel_max_distance=128, rel_bidirectional=True, mask_callback=None,
              bias_callback=None, return_lse=False, strategy="auto", precision=None, sinks=None,
              dropout_p=0.0, dropout_seed=0, dropout_offset=0,
              block_table=None, key_format=None, value_format=None, key_scales=None, value_scales=None):
    """Scaled dot-product attention on NumPy arrays by the C library.

    query [B, T, N, H], key [B, S, K, H], value [B, S, K, Hv] (or 3-D without
    B), one dtype of float32, bfloat16 (ml_dtypes) or float16; N % K == 0
    (GQA). bias (additive, any real dtype, used as float32) and mask (boolean,
    True = attend) broadcast to [B, N, T, S]. Semantics follow
    jax.nn.dot_product_attention, plus:
      causal_alignment  'top_left' (jax, PyTorch) or 'bottom_right'
                        (FlashAttention): where query i and key j meet,
                        for the causal mask and, with is_causal or not, for
                        windows, ALiBi and rel_table (bottom-right: i +
                        kv_len - q_len against j, per sequence)
      segment_ids       [B, T] (T == S) or (q_ids [B, T], kv_ids [B, S])
      alibi_slopes      [N]; rel_table [N, buckets] (T5 bucketing,
                        rel_max_distance, rel_bidirectional); softcap > 0
      mask_callback, bias_callback   MaskCallback / BiasCallback
      sinks             [N] float32, finite: one logit per query head that
                        joins every row's softmax denominator and has no
                        value (gpt-oss); lse includes it, and a row that
                        sees no key gets zeros and lse = sinks[n]
      dropout_p, dropout_seed, dropout_offset
                        dropout on the attention weights: each is dropped
                        with probability dropout_p (the rest scaled by
                        1 / (1 - dropout_p)) by a hash of the seed and the
                        score's index (fmha_problem.dropout_p); the same
                        arguments to attention_backward give the gradients
                        of that same draw
      strategy          'auto', 'tiled', 'dense' or 'portable'
      precision         'fast' (default; None is 'fast') or 'accurate', and for
                        float32 'bf16x3' (a CPU with AMX) or 'bf16' (AMX,
                        AVX512-BF16 or Arm's BF16); see
                        fmha_precision in fmha.h. bf16: 'fast' rounds P to
                        bf16 in P V (as accurate as PyTorch's fused CPU
                        kernel), 'accurate' adds its residual. float32 with
                        AMX: 'bf16x3' splits Q, K, V, P into bf16 hi + lo
                        (three tile products, about 2^-16), 'bf16' rounds
                        them (with AVX512-BF16 or Arm's BF16 alone too, on
                        bf16 pair products); elsewhere float32 FMA. int8, q8_0 and q4_0
                        key caches (decoding): 'fast' quantizes the query as
                        q8_0 for integer dot products (llama.cpp's
                        arithmetic, and its error), 'accurate' keeps it in
                        float32
      key, value        bfloat16 or float16 beside float32 query: a KV cache
                        dtype of its own (widened as read; out is float32)
      block_table       int32 [B, max_pages]: key and value are page pools
                        [num_pages, page_size, K, H] and key j of sequence b
                        is row j % page_size of page block_table[b, j //
                        page_size] (vLLM, FlashAttention); needs
                        key_value_seq_lengths; forward only
      key_format, value_format
                        a quantized KV cache, each tensor in its own format
                        (None: the array's dtype): "int8" (int8 [B, S, K, H],
                        key_scales float32 [B, S, K]: one per key and head),
                        "fp8_e4m3" / "fp8_e5m2" (uint8 bits or ml_dtypes
                        float8 arrays [B, S, K, H], scales [K] or None = 1),
                        "q8_0" / "q4_0" (GGUF blocks, uint8 [B, S, K, H / 32 *
                        34] / [.., H / 32 * 18], scales inside: no *_scales);
                        with block_table the page-pool forms ([P, page, K, ..],
                        int8 scales [P, page, K]). quantize_kv writes them. The
                        result is attention over the dequantised values;
                        forward only
    A query row that sees no key gets zeros (and lse = -inf, or its sink).

    Returns out [B, T, N, Hv] (query's dtype), or (out, lse) with lse float32
    [B, N, T] ([N, T] for 3-D inputs) when return_lse.
    """
    call, q, k, v, batched = _prepare(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal, causal_alignment=causal_alignment,
        local_window_size=local_window_size, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, segment_ids=segment_ids, alibi_slopes=alibi_slopes,
        rel_table=rel_table, rel_max_distance=rel_max_distance, rel_bidirectional=rel_bidirectional,
        softcap=softcap, strategy=strategy, mask_callback=mask_callback, bias_callback=bias_callback,
        precision=precision, sinks=sinks, dropout_p=dropout_p, dropout_seed=dropout_seed,
        dropout_offset=dropout_offset, block_table=block_table, key_format=key_format,
        value_format=value_format, key_scales=key_scales, value_scales=value_scales)
    B, T, N, S, K, H, Hv = call.shape
    out = np.empty((B, T, N, Hv), dtype=q.dtype)
    lse = np.empty((B, N, T), dtype=np.float32) if return_lse else None
    if 0 in (B, T, N, S, Hv):
        # an empty dim (as PyTorch): an empty output, or with no keys (S = 0) rows that see none:
        # zeros, lse -inf (or the head's sink)
        out[...] = 0
        if lse is not None:
            lse[...] = -np.inf if call.sinks is None else call.sinks.reshape(1, N, 1)
    elif (plan := _cached_plan(call, q, k, v, (T * N * Hv, N * Hv, Hv, 1))) is not None:
        plan.forward(q.ctypes.data, k.ctypes.data, v.ctypes.data, out.ctypes.data,
                     lse.ctypes.data if lse is not None else None)
    else:
        _describe(call, q, k, v)
        lse_ptr = ctypes.cast(_address(lse), ctypes.POINTER(ctypes.c_float)) if lse is not None else None
        _run(call, "fmha_forward", _address(q), _address(k), _address(v), _address(out), lse_ptr, None, 0)
    if not batched:
        out = out[0]
        lse = lse[0] if lse is not None else None
    return (out, lse) if return_lse else out


def _same_layout_copy(x, like):
    """x's values in an array laid out as `like` (strides in elements)."""
    y = np.empty_like(like)
    y[...] = x
    return y


def describe(query, key, value, bias=None, mask=None, **options):
    """What fmha.attention would run for these arguments (the same ones, and
    the same checks): fmha_plan_describe's line of key=value fields, e.g.
    "driver=tiled isa=amx path=bf16 precision=fast k_format=bf16 ...
    threads=2 cpu=... tuning=generic". Tells which driver (decode, dense,
    tiled), which instruction set (amx, avx512bf16, avx512, avx2, neon,
    scalar), which operand path and which tuning (FMHA_TUNING) serve the
    call, without running it. Arrays only need the shapes and
    dtypes of the real call."""
    import inspect

    params = inspect.signature(attention).parameters
    keywords = {n: p.default for n, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(options) - set(keywords))
    if unknown:
        raise TypeError(f"fmha.describe: unexpected keyword argument(s) {', '.join(unknown)}")
    keywords.update(options)
    keywords.pop("return_lse")
    call, q, k, v, batched = _prepare(query, key, value, bias, mask, **keywords)
    _describe(call, q, k, v)
    return _lib.Plan(call.problem).describe()


def attention_backward(query, key, value, out, lse, d_out, bias=None, mask=None, *, scale=None,
                       is_causal=False, causal_alignment="top_left", local_window_size=None,
                       query_seq_lengths=None, key_value_seq_lengths=None, segment_ids=None,
                       alibi_slopes=None, softcap=None, rel_table=None, rel_max_distance=128,
                       rel_bidirectional=True, mask_callback=None, bias_callback=None,
                       return_bias_grads=False, strategy="auto", precision=None, sinks=None,
                       dropout_p=0.0, dropout_seed=0, dropout_offset=0, key_format=None, value_format=None,
                       key_scales=None, value_scales=None):
    """Gradients of `attention` by the C backward (fmha_backward).

    out and lse are attention(..., return_lse=True)'s results for the same
    arguments; d_out is dL/dout. Returns (dq, dk, dv), in the shapes and
    dtype of query, key and value (dk, dv summed over the query heads that
    share a key/value head). With return_bias_grads, returns (dq, dk, dv,
    grads) where grads maps 'bias', 'alibi_slopes', 'rel_table' and 'sinks'
    (those given) to their float32 gradients (bias's in bias's own shape:
    summed over the dimensions it broadcasts; the sinks' from
    fmha_sinks_backward). A bias_callback receives its gradient through its
    accumulate_grad. A quantized cache (key_format, value_format) is forward
    only: FmhaError (FMHA_ERR_UNSUPPORTED).
    """
    if key_format is not None or value_format is not None:
        raise FmhaError(_lib.ERR_UNSUPPORTED, "a quantized KV cache (key_format / value_format) is forward only: "
                        "fmha has no backward for it", "fmha.attention_backward")
    call, q, k, v, batched = _prepare(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal, causal_alignment=causal_alignment,
        local_window_size=local_window_size, query_seq_lengths=query_seq_lengths,
        key_value_seq_lengths=key_value_seq_lengths, segment_ids=segment_ids, alibi_slopes=alibi_slopes,
        rel_table=rel_table, rel_max_distance=rel_max_distance, rel_bidirectional=rel_bidirectional,
        softcap=softcap, strategy=strategy, mask_callback=mask_callback, bias_callback=bias_callback,
        precision=precision, sinks=sinks, dropout_p=dropout_p, dropout_seed=dropout_seed,
        dropout_offset=dropout_offset)
    B, T, N, S, K, H, Hv = call.shape
    o = _as_array(out, "out")
    do = _as_array(d_out, "d_out")
    lse_a = _as_array(lse, "lse")
    if not batched:
        o, do, lse_a = o[None], do[None], lse_a[None]
    if o.shape != (B, T, N, Hv) or do.shape != (B, T, N, Hv):
        raise ValueError(f"fmha: out and d_out must have shape {(B, T, N, Hv)[0 if batched else 1:]}, got "
                         f"{o.shape[0 if batched else 1:]} and {do.shape[0 if batched else 1:]}")
    if o.dtype != q.dtype or do.dtype != q.dtype:
        raise TypeError(f"fmha: out and d_out must have query's dtype {q.dtype}, got {o.dtype} and {do.dtype}")
    if lse_a.shape != (B, N, T):
        raise ValueError(f"fmha: lse must have shape {(B, N, T)[0 if batched else 1:]} (from "
                         f"attention(..., return_lse=True)), got {lse_a.shape[0 if batched else 1:]}")
    lse_a = np.ascontiguousarray(lse_a, dtype=np.float32)
    if 0 in (B, T, N, S, Hv):
        # an empty dim (as PyTorch): zero gradients of the given shapes
        dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        results = {}
        if return_bias_grads:
            for name, x in (("bias", call.bias4), ("alibi_slopes", call.alibi), ("rel_table", call.rel_table),
                            ("sinks", call.sinks)):
                if x is not None:
                    results[name] = np.zeros(x.shape, np.float32)
            if "bias" in results:
                results["bias"] = results["bias"].reshape(call.bias_shape)
        if not batched:
            dq, dk, dv = dq[0], dk[0], dv[0]
        return (dq, dk, dv, results) if return_bias_grads else (dq, dk, dv)

    # The gradients take the strides of q, k, v and dO takes those of O:
    # arrange the inputs so that fresh gradient arrays can share them.
    grads_like = []
    for x in (q, k, v):
        g = np.empty_like(x)
        if g.strides != x.strides:
            x = _same_layout_copy(x, g)
        grads_like.append((x, g))
    (q, dq), (k, dk), (v, dv) = grads_like
    o = _usable(o)
    if np.empty_like(o).strides != o.strides:
        o = _same_layout_copy(o, np.empty_like(o))
    if do.strides != o.strides:
        do = _same_layout_copy(do, o)
    plan = _cached_plan(call, q, k, v, _bshd(o))
    if plan is not None:
        plan.backward(q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data, do.ctypes.data,
                      lse_a.ctypes.data, dq.ctypes.data, dk.ctypes.data, dv.ctypes.data)
        if not batched:
            dq, dk, dv = dq[0], dk[0], dv[0]
        return (dq, dk, dv, {}) if return_bias_grads else (dq, dk, dv)
    _describe(call, q, k, v)
    call.problem.o_strides[:] = _bshd(o)

    grads = None
    results = {}
    if return_bias_grads and (call.bias4 is not None or call.alibi is not None or call.rel_table is not None):
        grads = _lib.fmha_param_grads()
        if call.bias4 is not None:
            d_bias = np.zeros(call.bias4.shape, np.float32)
            grads.d_dense = _ptr(ctypes.c_float, d_bias.ctypes.data)
            grads.d_dense_strides[:] = broadcast_strides(d_bias.shape, _elem_strides(d_bias), (B, N, T, S),
                                                         "bias")
            results["bias"] = d_bias
        if call.alibi is not None:
            d_alibi = np.zeros(N, np.float32)
            grads.d_alibi = _ptr(ctypes.c_float, d_alibi.ctypes.data)
            results["alibi_slopes"] = d_alibi
        if call.rel_table is not None:
            d_rel = np.zeros(call.rel_table.shape, np.float32)
            grads.d_rel_table = _ptr(ctypes.c_float, d_rel.ctypes.data)
            results["rel_table"] = d_rel
    lse_ptr = ctypes.cast(_address(lse_a), ctypes.POINTER(ctypes.c_float))
    _run(call, "fmha_backward", _address(q), _address(k), _address(v), _address(o), _address(do), lse_ptr,
         _address(dq), _address(dk), _address(dv), ctypes.byref(grads) if grads is not None else None, None, 0)
    if return_bias_grads and call.sinks is not None:
        d_sinks = np.zeros(N, np.float32)
        _run(call, "fmha_sinks_backward", _address(o), _address(do), lse_ptr,
             _ptr(ctypes.c_float, d_sinks.ctypes.data))
        results["sinks"] = d_sinks
    if "bias" in results:
        results["bias"] = results["bias"].reshape(call.bias_shape)
    if not batched:
        dq, dk, dv = dq[0], dk[0], dv[0]
    if return_bias_grads:
        return dq, dk, dv, results
    return dq, dk, dv


def merge(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets, from the results
    over each (fmha_merge): lse = logaddexp(lse_a, lse_b) and
    out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.

    out_a, out_b [B, T, N, Hv] (or [T, N, Hv]) and lse_a, lse_b [B, N, T]
    (or [N, T]) as attention(..., return_lse=True) returns them; float32
    (other real dtypes are converted). A side whose lse is -inf (its rows saw
    no key) contributes nothing; both -inf gives zeros and -inf. Returns
    (out, lse), float32.
    """
    o_a, o_b = (np.ascontiguousarray(_as_array(x, n), dtype=np.float32) for x, n in ((out_a, "out_a"),
                                                                                 (out_b, "out_b")))
    l_a, l_b = (np.ascontiguousarray(_as_array(x, n), dtype=np.float32) for x, n in ((lse_a, "lse_a"),
                                                                                 (lse_b, "lse_b")))
    if o_a.shape != o_b.shape or o_a.ndim not in (3, 4):
        raise ValueError(f"fmha: out_a and out_b must share a [B, T, N, Hv] or [T, N, Hv] shape, got {o_a.shape} "
                         f"and {o_b.shape}")
    batched = o_a.ndim == 4
    shape4 = o_a.shape if batched else (1,) + o_a.shape
    B, T, N, Hv = shape4
    want = (B, N, T) if batched else (N, T)
    if l_a.shape != want or l_b.shape != want:
        raise ValueError(f"fmha: lse_a and lse_b must have shape {want}, got {l_a.shape} and {l_b.shape}")
    out = np.empty(o_a.shape, np.float32)
    lse = np.empty(want, np.float32)
    strides = (ctypes.c_int64 * 4)(T * N * Hv, N * Hv, Hv, 1)
    f = ctypes.POINTER(ctypes.c_float)
    status = _lib.load().fmha_merge(B, N, T, Hv, strides, *(ctypes.cast(x.ctypes.data, f)
                                                           for x in (o_a, l_a, o_b, l_b, out, lse)))
    _lib.check(status, "fmha_merge")
    return out, lse
