"""fmha.jax: jax.nn.dot_product_attention's signature, served by fmha's C
kernels through JAX's FFI.

The two XLA CPU custom calls ("fmha_forward", "fmha_backward") live in
_ffi/fmha_jax_ffi.c (C, against XLA's C API). An installed package ships them compiled
(_ffi/fmha_jax_ffi.so, built with the package against the jaxlib present
then); it is used when the package's own libfmha.so is loaded and the
running jaxlib serves the XLA FFI API version it was built for (same major,
same or newer minor; _ffi/fmha_jax_ffi.json records it). Otherwise (a
source checkout, FMHA_LIBRARY, another jaxlib, a package built without jax)
the file is compiled on first use with the system C compiler (CC, else
cc/gcc/clang) against jax.ffi.include_dir() and fmha.h, linked to the libfmha.so
that fmha._lib loaded, and cached under FMHA_FFI_CACHE (default
~/.cache/fmha/ffi), keyed by a hash of its inputs. The handlers run fmha
plans on XLA's buffers, kept in a bounded cache keyed by the whole C problem
(plan_cache_info); nothing is computed in Python. Building, registering
and calling them is _jax_core.py's, which ring_attention (_jax_ring.py)
shares.

Differentiation: a jax.custom_vjp whose backward is fmha_backward, fed the
log-sum-exp saved by the forward. Gradients flow to query, key, value,
bias, alibi_slopes and rel_table (fmha_param_grads) and sinks
(fmha_sinks_backward); each parameter's gradient is computed only when it
is differentiated. Integer inputs (lengths, segment ids) get none. Paged
caches (block_table=) and bf16 / f16 caches beside a float32 query are
forward only: the backward rule raises FmhaError when a cotangent reaches
them. Reverse mode only: forward mode (jax.jvp, jacfwd, hessian) and a
second derivative are refused by JAX (a custom_vjp has no JVP rule, and
the backward is an FFI call of its own).

vmap: ffi_call's vmap_method="expand_dims". Unbatched operands gain a
size-1 leading dimension and the handlers accept any number of leading
dimensions (size 1 broadcasts); they fold them into the batch, or loop over
them when an operand broadcasts. One custom call per vmapped call, no
Python loop, and exact for every batching pattern.

Rows that see no key at all (a fully masked row) follow
jax.nn.dot_product_attention: its masked scores are one large negative
number, so such a row weighs every key alike and gets the mean of all S
values (its residual that number, -0.7 times float32's largest), and a
row past query_seq_lengths gets zeros; the gradient takes the mean's path
(dV gains the row's dO / S, dQ and dK nothing). The C library gives such
rows zeros; fmha.jax puts the mean in their place, except over a paged or
quantized cache (block_table, key_format), where they stay zeros.

A bias that pushes every key of a row down by a huge finite amount (-1e9,
jnp.finfo(jnp.float32).min) gives that row the right output, but its
gradients use the log-sum-exp saved in float32, which at that magnitude has
lost its log(S): they come out S times too large (fmha.h, "Huge finite
scores"). Hide keys with mask, or a bias of -inf.
"""

import ctypes
import functools

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.jax needs JAX: pip install jax") from e

from . import _lib, _spec, api
from ._jax_core import _Config, _backward, _ensure_registered, _forward
from ._jax_core import _build, ffi_library_path, plan_cache_clear, plan_cache_info  # noqa: F401  (fmha.jax's names)
from ._jax_ring import ring_attention
from ._lib import FmhaError

__all__ = ["dot_product_attention", "quantize_kv", "ring_attention", "ffi_library_path", "FmhaError"]


# ---- the differentiable call ------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, extras, cfg):
    return _forward(q, k, v, extras, cfg)


def _value(x):
    return getattr(x, "value", x)


def _attention_fwd(q, k, v, extras, cfg):
    # symbolic_zeros=True: the primals arrive as CustomVJPPrimal(value, perturbed).
    # A float parameter's gradient is computed only when it is differentiated.
    wanted = tuple(name for name in _spec.GRAD_NAMES
                   if extras[name] is not None and bool(getattr(extras[name], "perturbed", True)))
    q, k, v = map(_value, (q, k, v))
    extras = {name: _value(x) for name, x in extras.items()}
    o, lse = _forward(q, k, v, extras, cfg)
    # The wanted names travel as the keys of a dict (static pytree structure).
    return (o, lse), (q, k, v, extras, o, lse, {name: None for name in wanted})


def _attention_bwd(cfg, res, cotangents):
    q, k, v, extras, o, lse, wanted = res
    d_o = cotangents[0]  # lse's cotangent is ignored: it is a stop-gradient output
    d_extras = {name: None for name in extras}  # integer inputs and unwanted parameters: none
    if isinstance(d_o, SymbolicZero):
        for name in wanted:
            d_extras[name] = jnp.zeros(extras[name].shape, extras[name].dtype)
        return tuple(jnp.zeros(x.shape, x.dtype) for x in (q, k, v)) + (d_extras,)
    refused = api.forward_only_error(extras["block_table"] is not None, q.dtype, k.dtype,
                                     "fmha.jax.dot_product_attention", "apply jax.lax.stop_gradient to its inputs")
    if refused is not None:  # raised while jax.grad / vjp traces the backward
        raise refused
    grads = _backward(q, k, v, o, lse, d_o.astype(o.dtype), extras, cfg, tuple(wanted))
    for name, g in zip([n for n in _spec.GRAD_NAMES if n in wanted], grads[3:]):
        d_extras[name] = g
    return (grads[0], grads[1], grads[2], d_extras)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# ---- the public function ---------------------------------------------------------------------

def _ensure_4d(x):
    x = jnp.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


def _check_config(dtype, B, N, K, T, S, H, Hv, cfg, extras, kv_dtype=0, pool=None):
    """Raises FmhaError now (at trace time) for a request the library refuses:
    the problem with stand-in arrays of the extras' shapes (their values are
    only known when the call runs). pool: (num_pages, page_size) of a paged
    cache, whose stand-in table names page 0 only."""
    rows = S if pool is None else pool[1]  # keys between one batch entry (or page) and the next
    p = api.new_problem(dtype, (B, N, K, T, S, H, Hv), (T * N * H, N * H, H, 1), (rows * K * H, K * H, H, 1),
                        (rows * K * Hv, K * Hv, Hv, 1), (T * N * Hv, N * Hv, Hv, 1), scale=cfg.scale,
                        causal=cfg.causal, strategy=cfg.strategy, window=cfg.window)
    p.precision = cfg.precision
    p.kv_dtype = kv_dtype
    p.biases.softcap = cfg.softcap
    keep = []

    def stand_in(shape, dtype, fill, ctype=None):
        """An array kept alive for the check: its address, or a ctype pointer to it."""
        a = np.full(shape, fill, dtype)
        keep.append(a)
        return a.ctypes.data if ctype is None else ctypes.cast(ctypes.c_void_p(a.ctypes.data),
                                                                ctypes.POINTER(ctype))

    if extras["bias"] is not None:
        api.set_dense_bias(p, stand_in(1, np.float32, 0), [0, 0, 0, 0])
    if extras["mask"] is not None:
        api.set_dense_mask(p, stand_in(1, np.uint8, 1), [0, 0, 0, 0])
    if extras["q_lens"] is not None:
        p.masks.q_lengths = stand_in(B, np.int32, T, ctypes.c_int32)
    if extras["kv_lens"] is not None:
        p.masks.kv_lengths = stand_in(B, np.int32, S, ctypes.c_int32)
    if extras["q_seg"] is not None:
        p.masks.q_segment_ids = stand_in((B, T), np.int32, 0, ctypes.c_int32)
        p.masks.kv_segment_ids = stand_in((B, S), np.int32, 0, ctypes.c_int32)
    if extras["alibi"] is not None:
        p.biases.alibi_slopes = stand_in(N, np.float32, 0, ctypes.c_float)
    if extras["rel"] is not None:
        p.biases.rel_table = stand_in(extras["rel"].shape, np.float32, 0, ctypes.c_float)
        p.biases.rel_num_buckets = extras["rel"].shape[1]
        p.biases.rel_max_distance = cfg.rel_max_distance
        p.biases.rel_bidirectional = cfg.rel_bidirectional
    if extras["sinks"] is not None:
        p.sinks = stand_in(N, np.float32, 0, ctypes.c_float)
    if pool is not None:
        table_shape = extras["block_table"].shape
        p.block_table = stand_in(table_shape, np.int32, 0, ctypes.c_int32)
        p.block_table_stride = table_shape[1]
        p.num_pages, p.page_size = pool
    p.dropout_p = cfg.dropout_p
    lib = _lib.load()
    if pool is None and not kv_dtype:
        _lib.check(lib.fmha_problem_check(ctypes.byref(p)), "fmha.jax.dot_product_attention")
    else:  # what a paged cache or a cache dtype can be served with is known to the planner: ask it
        _lib.check(lib.fmha_forward_workspace_size(ctypes.byref(p), ctypes.byref(ctypes.c_size_t())),
                   "fmha.jax.dot_product_attention")


def _checked_array(x, shape, kind, name):
    """x as an array of `shape` whose dtype is of `kind` (jnp.integer: cast
    to int32; jnp.floating: to float32, the gradient returning in x's own
    dtype)."""
    x = jnp.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{name} shape should be {shape}: but got {x.shape}")
    if not jnp.issubdtype(x.dtype, kind):
        raise ValueError(f"{name} dtype should be {kind.__name__}, but got {x.dtype}")
    if kind is jnp.integer and jnp.iinfo(x.dtype).bits > 32 or x.dtype == jnp.uint32:
        # values of a wider integer saturate to int32's ends instead of wrapping (traced: no
        # value check at trace time); a page index out of range is then refused by the library
        x = jnp.clip(x, -2**31, 2**31 - 1)
    return x.astype(jnp.int32 if kind is jnp.integer else jnp.float32)


def _paged_sizes(query, key, value, q, block_table, key_value_seq_lengths, page_size):
    """(B, S, table) of a paged call: the batch, the most keys a sequence can
    hold (max_pages * page_size) and the table as int32 [B, max_pages]."""
    if jnp.ndim(query) != 4 or jnp.ndim(key) != 4 or jnp.ndim(value) != 4:
        raise ValueError("block_table needs 4-D query [B, T, N, H] and page pools key and value [num_pages, "
                         f"page_size, K, H], got {jnp.ndim(query)}, {jnp.ndim(key)} and {jnp.ndim(value)} dims")
    table = jnp.asarray(block_table)
    B = q.shape[0]
    if table.ndim != 2 or table.shape[0] != B or table.shape[1] < 1:
        raise ValueError(f"block_table shape should be ({B}, max_pages >= 1): but got {table.shape}")
    if key_value_seq_lengths is None:
        raise ValueError("block_table needs key_value_seq_lengths (the keys each sequence holds)")
    return B, table.shape[1] * page_size, _checked_array(table, table.shape, jnp.integer, "block_table")


def _quantized_cache_attention(query, key, value, return_residual, key_format, value_format, key_scales,
                               value_scales, options):
    """dot_product_attention over a quantized cache: fmha.attention (NumPy) on
    the host through jax.pure_callback; forward only. The call is checked
    while tracing (fmha.describe on zero-stride stand-ins of the arrays, so
    nothing of the cache's size is allocated)."""
    arrays = dict(query=query, key=key, value=value, key_scales=key_scales, value_scales=value_scales,
                  **{n: options.pop(n) for n in ("query_seq_lengths", "key_value_seq_lengths", "alibi_slopes",
                                                  "sinks", "block_table")})
    names = [n for n, x in arrays.items() if x is not None]
    scale = options.pop("scale")
    if scale is not None and not isinstance(scale, (int, float)):
        raise ValueError("a quantized cache takes a Python number as scale, not a traced one")

    def stand_in(name, x):
        """Zeros of x's dtype and shape: broadcast (zero strides), or for the
        tensors a contiguous view over one element (describe never reads
        them, and a cache's blocks need their own strides)."""
        dtype, shape = np.dtype(jnp.result_type(x)), tuple(jnp.shape(x))
        if name not in ("query", "key", "value"):
            return np.broadcast_to(np.zeros((), dtype), shape)
        strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize for i in range(len(shape)))
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides, writeable=False)

    given = {n: stand_in(n, arrays[n]) for n in names}
    api.describe(given.pop("query"), given.pop("key"), given.pop("value"), key_format=key_format,
                 value_format=value_format, scale=scale, **given, **options)
    q_shape = tuple(jnp.shape(query))
    v_last = jnp.shape(value)[-1]
    Hv = _spec.kv_format_head_dim(value_format, v_last) if value_format else v_last
    out_type = jax.ShapeDtypeStruct(q_shape[:-1] + (Hv,), jnp.result_type(query))
    lse_type = jax.ShapeDtypeStruct((q_shape[0], q_shape[2], q_shape[1]) if len(q_shape) == 4
                                    else (q_shape[1], q_shape[0]), jnp.float32)

    def host(*values):
        named = dict(zip(names, (np.asarray(x) for x in values)))
        q, k, v = named.pop("query"), named.pop("key"), named.pop("value")
        return api.attention(q, k, v, key_format=key_format, value_format=value_format, scale=scale,
                             return_lse=True, **named, **options)

    @jax.custom_vjp
    def run(*values):
        return jax.pure_callback(host, (out_type, lse_type), *values, vmap_method="sequential")

    def run_fwd(*values):
        return run(*values), None

    def run_bwd(_, cotangents):
        raise FmhaError(_lib.ERR_UNSUPPORTED, "a quantized KV cache (key_format / value_format) is forward only: "
                        "fmha has no backward for it", "fmha.jax.dot_product_attention")

    run.defvjp(run_fwd, run_bwd)
    out, lse = run(*(arrays[n] for n in names))
    return (out, lse) if return_residual else out


def quantize_kv(x, format, scales=None):
    """fmha.quantize_kv (NumPy) on a JAX array, on the host: (values, scales)
    as dot_product_attention's key_format reads them."""
    values, out_scales = api.quantize_kv(np.asarray(x), format, scales=None if scales is None else np.asarray(scales))
    return jnp.asarray(values), None if out_scales is None else jnp.asarray(out_scales)


# jax_default_matmul_precision values and the fmha precision a float32 call
# takes from them when it names none
_MATMUL_PRECISIONS = {"high": "bf16x3", "bfloat16_3x": "bf16x3", "BF16_BF16_F32_X3": "bf16x3", "bfloat16": "bf16",
                      "BF16_BF16_F32": "bf16"}


def _framework_precision(dtype):
    """The precision of a call that names none: for float32, what
    jax.default_matmul_precision asks for (read while tracing), else fast."""
    if jnp.dtype(dtype) != jnp.float32:
        return "fast"
    setting = jax.config.jax_default_matmul_precision
    return _MATMUL_PRECISIONS.get(str(setting), "fast") if setting is not None else "fast"


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False, causal_alignment="top_left",
                          segment_ids=None, alibi_slopes=None, rel_table=None, rel_max_distance=128,
                          rel_bidirectional=True, softcap=None, sinks=None, precision=None, dropout_p=0.0,
                          dropout_rng=None, block_table=None, key_format=None, value_format=None,
                          key_scales=None, value_scales=None):
    """jax.nn.dot_product_attention computed by fmha's C kernels.

    Same arguments, shapes ([B, T, N, H] or [T, N, H]; GQA through fewer key
    heads) and results as jax.nn.dot_product_attention. implementation None
    (or 'fmha') runs fmha; 'xla' and 'cudnn' hand the call to
    jax.nn.dot_product_attention. dtypes: float32, bfloat16, float16; key
    and value may be bfloat16 or float16 beside a float32 query (a KV cache
    dtype of its own, widened as read; out is float32; forward only).

    fmha's own keywords, as in fmha.attention (no dense tensor is built):
      causal_alignment  'top_left' (jax) or 'bottom_right' (per sequence:
                        kv_len - q_len, from the length arrays when given);
                        it places windows, ALiBi and rel_table too, with
                        is_causal or without (FlashAttention's rule)
      segment_ids       [B, T] int (T == S) or a pair (q_ids [B, T], kv_ids
                        [B, S]): a key is visible from a query of its segment
      alibi_slopes      [N]: bias -slope[n] * |i - j| (differentiable)
      rel_table         [N, buckets]: T5 relative-position bias with
                        rel_max_distance, rel_bidirectional (differentiable)
      softcap           > 0: scores become softcap * tanh(scores / softcap)
      sinks             [N]: one logit per query head in every row's softmax
                        denominator, without a value (differentiable)
      precision         'fast' or 'accurate' (bf16 P V rounding); for
                        float32 'bf16x3' (on a CPU with AMX) or 'bf16' (AMX,
                        AVX512-BF16 or Arm's BF16)
                        (fmha.attention). None: for a float32 query the
                        matmul precision JAX is set to
                        (jax.default_matmul_precision: 'high',
                        'bfloat16_3x' or 'BF16_BF16_F32_X3' give 'bf16x3',
                        'bfloat16' or 'BF16_BF16_F32' give 'bf16'), else
                        'fast'
      dropout_p, dropout_rng  dropout on the attention weights (fmha_problem
                        .dropout_p): each dropped with probability dropout_p,
                        the rest scaled by 1 / (1 - dropout_p); dropout_rng,
                        a PRNG key, gives the seed: with
                        b = jax.random.bits(dropout_rng, (2,), uint32),
                        seed = b[0] << 32 | b[1], offset 0. The backward
                        draws the same weights; nothing is stored. Under
                        vmap, a key shared by the slices gives each the
                        same draw; map over keys for independent ones.
      block_table       int [B, max_pages]: a paged KV cache (vLLM,
                        FlashAttention): key and value are page pools
                        [num_pages, page_size, K, H] / [.., Hv] and key j of
                        sequence b is row j % page_size of page
                        block_table[b, j // page_size]. Needs 4-D query and
                        key_value_seq_lengths [B] (the keys each sequence
                        holds, at most max_pages * page_size; only the
                        entries of its first ceil(len / page_size) pages are
                        read, and must lie in [0, num_pages)). Causal,
                        windows, lengths, sinks, softcap and alibi_slopes
                        apply; masks, other biases, segment ids and
                        dropout do not. Forward only.
      key_format, value_format, key_scales, value_scales
                        a quantized KV cache with fmha.attention's forms
                        ("int8": int8 [B, S, K, H] and float32 scales [B,
                        S, K]; "fp8_e4m3" / "fp8_e5m2": uint8 bits or float8
                        arrays, scales [K] or None; "q8_0" / "q4_0": uint8
                        GGUF blocks [B, S, K, H / 32 x 34 or 18]; page pools
                        with block_table). fmha.quantize_kv (NumPy) or
                        fmha.jax.quantize_kv writes them. The call runs on
                        the host through jax.pure_callback (jit and vmap
                        work; forward only, not differentiable); masks,
                        biases other than softcap and ALiBi, segment ids
                        and dropout do not apply. precision is
                        fmha.attention's (None: 'fast', the query quantized
                        as llama.cpp does; 'accurate' keeps it float32).
    Paged caches and caches of their own dtype have no backward:
    differentiating such a call raises FmhaError (FMHA_ERR_UNSUPPORTED).
    scale may be traced (a learned temperature): Q is then multiplied by it
    before the call (in float32, rounded back to Q's dtype) and scale gets
    its gradient. An explicit scale 0 gives equal weights over the visible
    keys. An empty dim gives an empty output; S = 0 gives zeros (rows that
    see no key). Integer inputs (lengths, segment ids) get no gradient. Requests the C
    library refuses raise FmhaError while tracing; errors found while
    running (a length out of range, a non-finite sink) raise JAX's runtime
    error carrying the C message.
    """
    if implementation in ("xla", "cudnn"):
        given = dict(segment_ids=segment_ids, alibi_slopes=alibi_slopes, rel_table=rel_table, softcap=softcap,
                     sinks=sinks, block_table=block_table)
        native = [name for name, x in given.items() if x is not None] + (["dropout_p"] if dropout_p else [])
        if native or causal_alignment != "top_left":
            raise ValueError(f"implementation={implementation!r} takes none of fmha's own keywords, got "
                             f"{native or ['causal_alignment']}")
        return jax.nn.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size, implementation=implementation,
            return_residual=return_residual)
    if implementation not in (None, "fmha"):
        raise ValueError(f"Unsupported implementation option: {implementation}")
    if key_format is not None or value_format is not None:
        if any(x is not None for x in (bias, mask, segment_ids, rel_table)) or dropout_p:
            raise ValueError("a quantized cache (key_format / value_format) takes no bias, mask, segment_ids, "
                             "rel_table or dropout")
        return _quantized_cache_attention(query, key, value, return_residual, key_format, value_format, key_scales,
                                          value_scales, dict(scale=scale, is_causal=is_causal,
                                                             causal_alignment=causal_alignment,
                                                             local_window_size=local_window_size,
                                                             query_seq_lengths=query_seq_lengths,
                                                             key_value_seq_lengths=key_value_seq_lengths,
                                                             alibi_slopes=alibi_slopes, softcap=softcap,
                                                             sinks=sinks, block_table=block_table,
                                                             precision=precision))

    output_shape = jnp.shape(query)
    q, k, v = _ensure_4d(query), _ensure_4d(key), _ensure_4d(value)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"query, key and value must be 3-D or 4-D, got {q.ndim}, {k.ndim}, {v.ndim} dims")
    B, S, K, H = k.shape  # with block_table: num_pages, page_size, K, H
    if v.shape[:3] != (B, S, K):
        raise ValueError(f"value shape should be [{B}, {S}, {K}, Hv]: but got {v.shape}")
    pool = None
    if block_table is not None:
        pool = (B, S)
        B, S, table = _paged_sizes(query, key, value, q, block_table, key_value_seq_lengths, pool[1])
    if q.shape[0] != B or q.shape[3] != H:
        raise ValueError(f"query shape should be [{B}, -1, -1, {H}]: but got {q.shape}")
    code = api.dtype_code(q.dtype)
    kv_code = api.kv_dtype_code(code, api.dtype_code(k.dtype), api.dtype_code(v.dtype))
    if kv_code is None:
        raise ValueError(f"{api.KV_DTYPE_RULE}, got {q.dtype}, {k.dtype}, {v.dtype}")
    T, N = q.shape[1], q.shape[2]
    Hv = v.shape[3]
    if (N % K if K else N) != 0:
        raise ValueError(f"The number of query heads must be a multiple of key/value heads, but got {N} vs {K}")
    full = (B, N, T, S)
    extras = dict.fromkeys(_spec.EXTRA_NAMES)
    if pool is not None:
        extras["block_table"] = table
    if bias is not None:
        bias = _ensure_4d(bias)
        api.broadcast_strides(bias.shape, (1, 1, 1, 1), full, "bias")
        extras["bias"] = bias.astype(jnp.float32)  # its gradient returns in the bias's own dtype
    if mask is not None:
        mask = _ensure_4d(mask)
        if mask.dtype != np.bool_:
            raise ValueError(f"mask dtype should be bool, but got {mask.dtype}")
        api.broadcast_strides(mask.shape, (1, 1, 1, 1), full, "mask")
        extras["mask"] = mask
    for name, x, slot in (("query_seq_lengths", query_seq_lengths, "q_lens"),
                          ("key_value_seq_lengths", key_value_seq_lengths, "kv_lens")):
        if x is not None:
            x = jnp.asarray(x)
            if x.shape != (B,):
                raise ValueError(f"{name} shape should be ({B},): but got {x.shape}")
            if x.dtype != np.int32:
                raise ValueError(f"{name} dtype should be int32, but got {x.dtype}")
            if pool is None:  # as jax.nn: a length past the sequence means all of it, below 0 none
                x = jnp.clip(x, 0, T if slot == "q_lens" else S)
            extras[slot] = x
    if segment_ids is not None:
        if isinstance(segment_ids, (tuple, list)):
            if len(segment_ids) != 2:
                raise ValueError("segment_ids must be one [B, T] array or a (q_ids, kv_ids) pair")
            q_ids, kv_ids = segment_ids
        else:
            if T != S:
                raise ValueError(f"one segment_ids array needs T == S (got {T}, {S}); pass (q_ids, kv_ids)")
            q_ids = kv_ids = segment_ids
        extras["q_seg"] = _checked_array(q_ids, (B, T), jnp.integer, "query segment_ids")
        extras["kv_seg"] = _checked_array(kv_ids, (B, S), jnp.integer, "key_value segment_ids")
    if alibi_slopes is not None:
        extras["alibi"] = _checked_array(alibi_slopes, (N,), jnp.floating, "alibi_slopes")
    if rel_table is not None:
        rel_table = jnp.asarray(rel_table)
        if rel_table.ndim != 2 or rel_table.shape[0] != N:
            raise ValueError(f"rel_table shape should be ({N}, num_buckets): but got {rel_table.shape}")
        extras["rel"] = _checked_array(rel_table, rel_table.shape, jnp.floating, "rel_table")
    if sinks is not None:
        extras["sinks"] = _checked_array(sinks, (N,), jnp.floating, "sinks")
    if softcap is not None:
        softcap = float(softcap)
        if not (softcap > 0 and np.isfinite(softcap)):
            raise ValueError(f"softcap must be > 0 and finite, got {softcap}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0.0:
        if dropout_rng is None:
            raise ValueError("dropout_p > 0 needs dropout_rng (a jax.random key)")
        extras["dropout_seed"] = jax.random.bits(dropout_rng, (2,), jnp.uint32)
    precision_value = api.precision_code(precision, _framework_precision(q.dtype), "fmha.jax")
    if B * N * T * Hv == 0 or S == 0:  # an empty output, or rows that see no key: zeros
        out = jnp.zeros(output_shape[:-1] + (Hv,), q.dtype)
        return (out, jnp.full(output_shape[:-1], -jnp.inf, q.dtype)) if return_residual else out
    if isinstance(scale, jax.core.Tracer):  # traced (a learned temperature): Q scaled here, differentiably
        q = (q.astype(jnp.float32) * scale).astype(q.dtype)
        scale = 1.0
    cfg = _Config(scale=api.resolve_scale(scale, H), causal=api.causal_code(is_causal, causal_alignment),
                  window=api.window_sides(local_window_size), strategy=_lib.STRATEGIES["auto"],
                  softcap=softcap or 0.0, precision=precision_value,
                  rel_max_distance=int(rel_max_distance), rel_bidirectional=int(bool(rel_bidirectional)),
                  dropout_p=dropout_p)
    _check_config(code, B, N, K, T, S, H, Hv, cfg, extras, kv_code, pool)
    _ensure_registered()

    out, lse = _attention(q, k, v, extras, cfg)
    if pool is None:
        out, lse = _rows_without_keys_as_jax_nn(out, lse, v, extras["q_lens"])
    out = jnp.reshape(out, output_shape[:-1] + (Hv,))
    if return_residual:
        residual = jnp.transpose(lse, (0, 2, 1)).astype(q.dtype)  # [B, N, T] -> [B, T, N]
        return out, jnp.reshape(residual, output_shape[:-1])
    return out


# jax.nn's masked score (_get_large_negative for float32 scores)
_JAX_MASKED_SCORE = np.float32(-0.7 * np.finfo(np.float32).max)


def _rows_without_keys_as_jax_nn(out, lse, v, q_lens):
    """out [B, T, N, Hv] and lse [B, N, T] with jax.nn's rows that see no key
    (lse -inf here): the mean of v [B, S, K, Hv] over its S keys (zeros past
    q_lens), their lse the masked score, as logsumexp of S masked scores is.
    Under a cond: a call where every row sees a key does not read v again."""
    _, T, N, _ = out.shape
    none = jnp.isneginf(lse)  # [B, N, T]

    def fill(operands):
        out, lse = operands
        mean_rows = none
        if q_lens is not None:  # jax.nn zeroes the rows past a query length
            mean_rows = none & (jnp.arange(T, dtype=jnp.int32)[None, None, :] < q_lens[:, None, None])
        v_mean = jnp.mean(v.astype(jnp.float32), axis=1)  # [B, K, Hv]
        v_mean = jnp.repeat(v_mean, N // v.shape[2], axis=1)  # [B, N, Hv]: query head n reads kv head n // G
        rows = jnp.transpose(mean_rows, (0, 2, 1))[..., None]  # [B, T, N, 1]
        return jnp.where(rows, v_mean[:, None].astype(out.dtype), out), jnp.where(none, _JAX_MASKED_SCORE, lse)

    return jax.lax.cond(jnp.any(none), fill, lambda operands: operands, (out, lse))
