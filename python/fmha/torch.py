"""fmha.torch: torch.nn.functional.scaled_dot_product_attention's signature,
served by fmha's C kernels on CPU tensors.

The custom ops fmha::attention and fmha::attention_backward (torch.library)
call the C library through ctypes on the tensors' data pointers, with
[B, H, L, E] strides passed as they are (no copies for permuted or
broadcast inputs), through fmha plans cached per shapes, strides, dtype
and options (_PLANS, bounded). register_autograd makes the pair
differentiable (query, key, value, a float attn_mask, and the keywords
alibi_slopes, rel_table and sinks); register_fake gives torch.compile the
output shapes, so compiled graphs keep the op as one opaque call. Plain
eager calls run the same kernel and autograd pair without the dispatcher
(_attention, _EagerAttention), which would cost about as much as a small
problem's forward, and their backward reuses the forward's plan; compile,
torch.jit.trace, autocast, tensor subclasses and dispatch modes get the op;
torch.func transforms (grad, vjp, jacrev, vmap) get it through an
autograd.Function of the form they need (vmap of grad is refused).

After SDPA's own arguments, keyword-only, come the options of NumPy
fmha.attention with the same names and meanings (segment_ids, alibi_slopes,
rel_table, softcap, causal_alignment, local_window_size, sequence lengths,
precision, sinks, block_table for paged KV caches), validated by api.py's
helpers; key and value may be bf16 or f16 beside a float32 query. Under
torch.autocast("cpu") the ops run q, k, v in the autocast dtype, as
PyTorch's SDPA does (mixed float32 / bf16 inputs are accepted there).
dropout_p is served by the C library's dropout (seeded from torch's
generator). register_transformers() makes attn_implementation="fmha"
available to transformers models (AttentionInterface and
AttentionMaskInterface).

Derivatives are first order: a second derivative (a gradient taken with
create_graph=True and differentiated again, torch.func.grad nested in
torch.func.grad) and forward-mode AD (dual tensors, torch.func.jvp, jacfwd)
raise rather than returning a wrong or missing derivative.

Rows that see no key at all (a boolean attn_mask that is all False on a
row, or S = 0) give zeros, as PyTorch's CPU kernels do. Inputs with an
empty dim give an empty (or, for S = 0, a zero) output and zero gradients.
A torch.nn.attention.bias.CausalBias as attn_mask is served as is_causal
with its alignment (upper left: top_left; lower right: bottom_right).

A float attn_mask that pushes every key of a row down by a huge finite
amount (-1e9, torch.finfo(torch.float32).min, as some padding masks are
built) gives that row the right output, but its gradients use the
log-sum-exp saved in float32, which at that magnitude has lost its log(S):
they come out S times too large (fmha.h, "Huge finite scores"; PyTorch's
fused CPU kernel does the same, its math backend does not). A boolean mask
or -inf hides keys without it.

The ops, their registrations and the helpers shared with flex_attention
(PyTorch's BlockMask; ALiBi and softcap as fmha_bias, _torch_flex.py) and
ring_attention (_torch_ring.py) live in _torch_core.py; this module holds
the public functions and the eager path.
"""

import functools
import math

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.torch needs PyTorch (pip install torch); fmha's NumPy and JAX bindings "
                      "work without it") from e

from . import _lib, _spec, api
from ._lib import FmhaError
from ._torch_core import (_BLOCK_TABLE, _OPTIONS, _TENSORS, OPTIONAL_TENSORS, AttentionArgs, _Spec,
                          _attention_backward_impl, _attention_impl, _backward, _dtype_code, _float32_param,
                          _forward_run, _kv_dtype, _param_flags, _param_grads, _refusal, _setup_context,
                          refuse_forward_ad)
from ._torch_core import _PLANS, _problem, _seq_strides  # noqa: F401  (the plan cache tests use them here)
from ._torch_flex import flex_attention
from ._torch_ring import ring_attention

__all__ = ["scaled_dot_product_attention", "quantize_kv", "flex_attention", "ring_attention", "register_transformers",
           "transformers_attention", "FmhaError"]

try:  # PyTorch >= 2.2
    from torch.nn.attention.bias import CausalBias as _CausalBias, CausalVariant as _CausalVariant
except ImportError:  # pragma: no cover - depends on the environment
    _CausalBias = _CausalVariant = None


# Eager calls skip the dispatcher: the op's Python kernel and its autograd
# pair run directly (the dispatcher costs about as much as a small problem's
# whole forward). Everything else (torch.compile, tracing, autocast, torch.func
# transforms, tensor subclasses, dispatch and function modes) goes through
# the op, whose registrations serve it. The pair returns out alone and keeps
# lse (internal, never handed out) on ctx; the optional tensors are saved
# only when one is given. Each saved tensor and each extra output costs the
# autograd round trip about a microsecond. lse lives as long as the graph
# (B H L floats), as the plan does.
_NO_TENSORS = (None,) * len(OPTIONAL_TENSORS)


_NO_SECOND_DERIVATIVE = "fmha.torch: scaled_dot_product_attention has no second derivative (its backward is a C kernel)"


def _first_order_only(backward):
    """backward under no_grad, its gradients marked so that differentiating
    them raises. torch.autograd.function.once_differentiable marks them only
    when d_o itself requires grad, so a second derivative of a loss such as
    out.sum() (d_o a constant, the gradients still functions of q, k and v)
    came back as a silent, detached first-order gradient."""

    @functools.wraps(backward)
    def wrapper(ctx, *grad_outputs):
        with torch.no_grad():
            grads = backward(ctx, *grad_outputs)
        if not torch.is_grad_enabled():  # no create_graph
            return grads
        mark = torch._C._functions.DelayedError(
            f"{_NO_SECOND_DERIVATIVE}; a gradient of its gradients cannot be taken".encode(), len(grads))
        return mark(*[g.detach().requires_grad_() if g is not None else None for g in grads])

    return wrapper


class _EagerAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *inputs):
        q, k, v = inputs[:3]
        if len(inputs) != _BLOCK_TABLE + 1 or inputs[_BLOCK_TABLE] is not None:  # paged: checked by the impl
            out, lse = _attention_impl(*inputs)
            plan = None
        else:
            out, lse, plan = _forward_run(q, k, v, _Spec(*inputs[_TENSORS.start:]))
        tensors = inputs[_TENSORS]
        ctx.save_for_backward(q, k, v, out, *(tensors if any(t is not None for t in tensors) else ()))
        ctx.lse = lse
        ctx.options = inputs[_OPTIONS]
        ctx.refused = _refusal(inputs, q, k)
        # the forward's plan serves the backward when nothing else is asked of it
        ctx.plan = plan if not any(_param_flags(ctx.needs_input_grad)) else None
        return out

    @staticmethod
    @_first_order_only
    def backward(ctx, d_o):
        q, k, v, o, *tensors = ctx.saved_tensors
        lse = ctx.lse
        plan = ctx.plan
        if plan is not None and ctx.refused is None and d_o.dtype == o.dtype and d_o.stride() == o.stride():
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            if dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride():
                plan.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(),
                              lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
                return (dq, dk, dv) + (None,) * (len(ctx.needs_input_grad) - 3)
        return _param_grads(ctx, q, k, v, o, lse, tensors or _NO_TENSORS, d_o, _attention_backward_impl)


def _functorch_unwrap(t):
    """(t without its functorch wrappers (the values are the same), the
    wrappers' (is a vmap level, level) from the outermost); None stays None."""
    layers = []
    while t is not None and torch._C._functorch.is_functorch_wrapped_tensor(t):
        layers.append((torch._C._functorch.is_batchedtensor(t), torch._C._functorch.maybe_get_level(t)))
        t = torch._C._functorch.get_unwrapped(t)
    return t, layers


class _FunctorchAttention(torch.autograd.Function):
    """The op under functorch transforms (torch.func.grad, vjp, jacrev,
    vmap): an autograd.Function in the setup_context form they need (the
    op's own autograd registration is not). The forward's vmap is the op's
    batching fallback; the backward runs the kernel on the tensors
    unwrapped from grad transforms, or the backward op's batching fallback
    under vmap (vmap of grad is refused, and so is a grad transform nested
    around another: a second derivative)."""
    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        return torch.ops.fmha.attention(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, d_o, d_lse):
        unwrapped = [_functorch_unwrap(t) for t in ctx.saved_tensors + (d_o,)]
        # a second grad level around the call (grad of grad, a gradient
        # penalty under torch.func) would differentiate this backward, whose
        # kernel it cannot see: refused, not answered with zeros
        if len({level for _, layers in unwrapped for vmapped, level in layers if not vmapped}) > 1:
            raise NotImplementedError(f"{_NO_SECOND_DERIVATIVE}; nested torch.func.grad / vjp over it is not supported")
        # vmapped (jacrev): the backward op's batching fallback
        if any(vmapped for _, layers in unwrapped for vmapped, _ in layers):
            try:
                with torch._C._AutoDispatchBelowAutograd():
                    return _backward(ctx, d_o, d_lse)
            except RuntimeError as e:  # the op's autograd under vmap of grad
                if "setup_context" not in str(e):
                    raise
                raise NotImplementedError("fmha.torch: vmap of torch.func.grad over this call is not supported; "
                                          "loop over the batch, or use torch.func.jacrev / vjp") from e
        q, k, v, o, lse, *tensors, d_o = (t for t, _ in unwrapped)
        with torch._C._DisableFuncTorch():  # plain tensors in and out
            return _param_grads(ctx, q, k, v, o, lse, tensors, d_o, _attention_backward_impl)


def _attention(*args):
    """out of torch.ops.fmha.attention(*args); eager calls without the dispatcher."""
    tensors = [a for a in args[:_TENSORS.stop] if a is not None]  # q, k, v and the optional tensors
    if len(args) > _BLOCK_TABLE and args[_BLOCK_TABLE] is not None:
        tensors.append(args[_BLOCK_TABLE])
    refuse_forward_ad("fmha.torch", tensors)
    if torch._C._are_functorch_transforms_active() and not torch.compiler.is_compiling():
        return _FunctorchAttention.apply(*args)[0]
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_autocast_enabled("cpu")
            or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled() or any(type(t) is not torch.Tensor for t in tensors)):
        return torch.ops.fmha.attention(*args)[0]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return _EagerAttention.apply(*args)
    return _attention_impl(*args)[0]



def _int32_operand(x, lead, batch, check):
    """An int32 tensor from `check` (an api helper on NumPy) of x, a tensor or
    array whose leading dims `lead` (the inputs') are flattened into `batch`."""
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.shape[:len(lead)] == lead:
        a = a.reshape((batch,) + a.shape[len(lead):])
    return torch.from_numpy(check(a))


def _flat_mask(attn_mask, lead, batch, rest):
    """attn_mask, broadcastable to lead + rest ([..., H, L, S]), as a 4-D
    [B or 1, H or 1, L or 1, S or 1] tensor (a view unless leading dims
    broadcast partly)."""
    full = lead + rest
    if attn_mask.dim() > len(full):
        raise ValueError(f"fmha.torch: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"{list(full)}")
    m = attn_mask.reshape((1,) * (len(full) - attn_mask.dim()) + tuple(attn_mask.shape))
    m_lead = tuple(m.shape[:len(lead)])
    if any(n not in (1, f) for n, f in zip(m_lead, lead)):
        raise ValueError(f"fmha.torch: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"{list(full)}")
    if all(n == 1 for n in m_lead):
        return m.reshape((1,) + tuple(m.shape[len(lead):]))
    if len(lead) > 1:
        m = m.expand(lead + tuple(m.shape[len(lead):]))
    return m.reshape((batch,) + tuple(m.shape[len(lead):]))


class _EmptyAttention(torch.autograd.Function):
    """A call with an empty dim or no keys (S = 0): out [B, H, L, Ev] zeros
    (empty when a dim is 0, else rows that see no key) and zero gradients
    for the tensors given."""

    @staticmethod
    def forward(ctx, shape, *tensors):
        ctx.tensors = [(t.shape, t.dtype) if isinstance(t, torch.Tensor) else None for t in tensors]
        return tensors[0].new_zeros(shape)

    @staticmethod
    def backward(ctx, d_o):
        return (None,) + tuple(torch.zeros(t[0], dtype=t[1]) if t is not None and need else None
                               for t, need in zip(ctx.tensors, ctx.needs_input_grad[1:]))


def _numpy_of(t):
    """A CPU tensor's values as a NumPy array without a copy where possible
    (bfloat16 through ml_dtypes, float8 as its uint8 bits)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _tensor_of(a):
    """A NumPy result as a torch tensor (bfloat16 through its bits)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _quantized_cache_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_format,
                               value_format, key_scales, value_scales, options, unsupported):
    """scaled_dot_product_attention over a quantized cache: fmha.attention on
    the tensors' memory in [B, S, H, E] order (transposed views), forward only."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or not t.is_cpu:
            raise TypeError(f"fmha.torch: {name} must be a CPU torch.Tensor")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("fmha.torch: a quantized cache needs query [B, H, L, E] and key, value [B, Hkv, S, row] "
                         f"(pools [num_pages, Hkv, page_size, row]), got shapes {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    if dropout_p or unsupported:
        raise ValueError("fmha.torch: dropout, segment ids and rel_table do not apply to a quantized cache")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"fmha.torch: {query.shape[1]} query heads against {key.shape[1]} key heads need "
                         "enable_gqa=True")
    if torch.is_grad_enabled() and query.requires_grad:
        raise FmhaError(_lib.ERR_UNSUPPORTED, "a quantized KV cache (key_format / value_format) is forward "
                        "only: fmha has no backward for it", "fmha.torch.scaled_dot_product_attention")

    def seq_major(t):  # [B, H, S, x] -> [B, S, H, x] (a view)
        return _numpy_of(t.transpose(1, 2))

    def scales_of(x, fmt):
        if x is None:
            return None
        if fmt == "int8":  # [B, Hkv, S] -> [B, S, Hkv]
            return _numpy_of(x.transpose(1, 2))
        return _numpy_of(x)

    mask = bias = None
    if attn_mask is not None:
        m = _numpy_of(attn_mask)
        mask, bias = (m, None) if attn_mask.dtype == torch.bool else (None, m)
    opts = dict(options)
    for name in ("alibi_slopes", "sinks", "query_seq_lengths", "key_value_seq_lengths", "block_table"):
        if isinstance(opts[name], torch.Tensor):
            opts[name] = _numpy_of(opts[name])
    out = api.attention(seq_major(query), seq_major(key), seq_major(value), bias, mask, scale=scale,
                        is_causal=is_causal, key_format=key_format, value_format=value_format,
                        key_scales=scales_of(key_scales, key_format), value_scales=scales_of(value_scales, value_format),
                        **opts)
    return _tensor_of(out).transpose(1, 2)


def quantize_kv(x, format, scales=None):
    """fmha.quantize_kv on a torch tensor in SDPA's order: x [B, Hkv, S, E]
    (or a page pool [num_pages, Hkv, page_size, E]) to (values, scales) as
    scaled_dot_product_attention's key_format reads them: values [B, Hkv, S,
    row] (int8 or uint8), scales [B, Hkv, S] for int8, [Hkv] for fp8 (given
    or computed), None for q8_0 / q4_0."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError("fmha.torch.quantize_kv: x must be a 4-D tensor [B, Hkv, S, E]")
    xs = x.detach().float().transpose(1, 2).contiguous().numpy()  # [B, S, Hkv, E]
    sc = None if scales is None else _numpy_of(scales)
    values, out_scales = api.quantize_kv(xs, format, scales=sc)
    values = torch.from_numpy(values).transpose(1, 2)
    if out_scales is not None and out_scales.ndim == 3:
        out_scales = torch.from_numpy(out_scales).transpose(1, 2)
    elif out_scales is not None:
        out_scales = torch.from_numpy(out_scales)
    return values, out_scales


def _matmul_precision_setting():
    return torch.get_float32_matmul_precision()


# torch.compile reads the setting once, while tracing, as a constant (the
# call returns a str, which Dynamo cannot put in its graph)
if hasattr(torch, "compiler") and hasattr(torch.compiler, "assume_constant_result"):
    _matmul_precision_setting = torch.compiler.assume_constant_result(_matmul_precision_setting)


def _framework_precision(dtype):
    """The precision of a call that names none: for float32,
    torch.set_float32_matmul_precision's 'high' (bf16x3) or 'medium'
    (bf16), else fast."""
    if dtype != torch.float32:
        return "fast"
    return {"high": "bf16x3", "medium": "bf16"}.get(_matmul_precision_setting(), "fast")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, segment_ids=None, alibi_slopes=None, rel_table=None,
                                 rel_max_distance=128, rel_bidirectional=True, softcap=None,
                                 causal_alignment="top_left", local_window_size=None, query_seq_lengths=None,
                                 key_value_seq_lengths=None, precision=None, sinks=None, dropout_seed=None,
                                 dropout_offset=0, block_table=None, key_format=None, value_format=None,
                                 key_scales=None, value_scales=None):
    """torch.nn.functional.scaled_dot_product_attention by fmha's C kernels.

    query [..., H, L, E], key [..., Hkv, S, E], value [..., Hkv, S, Ev] on
    CPU, float32, bfloat16 or float16: any leading dims (shared by the
    three, or broadcast as SDPA broadcasts them, flattened into one batch
    dim B, a view where strides allow), or [L, E] alone. out [..., H, L, Ev] follows query's memory order as
    PyTorch's does ([B, L, H, Ev] memory for a query viewed from
    [B, L, H, E]). attn_mask: boolean (True = take part) or additive float,
    broadcastable to [..., H, L, S];
    its gradient is returned when it requires one. is_causal is top-left
    aligned and may be combined with attn_mask. enable_gqa allows
    H % Hkv == 0 with Hkv < H (a single key and value head, Hkv 1, needs
    no enable_gqa: it broadcasts, as in SDPA). dropout_p in [0, 1) drops attention weights
    by the C library's counter-based draw of (dropout_seed, dropout_offset),
    keyword-only, the seed drawn from torch's default generator when None;
    the backward redraws the same weights (the draw is not PyTorch's own).

    Keyword-only, with the meanings of fmha.attention (api.py):
    segment_ids ([B, L] when L == S, or a (q_ids [B, L], kv_ids [B, S])
    pair; B may be the leading dims), alibi_slopes [H], rel_table [H, buckets] (rel_max_distance,
    rel_bidirectional), softcap, causal_alignment ('top_left' or
    'bottom_right': it places the causal mask and, with is_causal or not,
    windows, ALiBi and rel_table), local_window_size (int or (left, right)),
    query_seq_lengths / key_value_seq_lengths [B], precision ('fast' or
    'accurate' for bf16; for float32 'bf16x3' on a CPU with AMX, 'bf16' with AMX,
    AVX512-BF16 or Arm's BF16;
    None: for float32, torch.get_float32_matmul_precision()'s 'high' gives
    'bf16x3' and 'medium' 'bf16', else 'fast'), sinks [H]. alibi_slopes, rel_table and sinks get
    gradients when they require them.

    key and value may be bfloat16 or float16 beside a float32 query: a KV
    cache dtype of their own, widened as read (out is float32; forward only).

    block_table, int [B, max_pages]: a paged KV cache (vLLM, FlashAttention).
    query is then [B, H, L, E] and key / value are page pools
    [num_pages, Hkv, page_size, E] / [.., Ev] (SDPA's head-before-sequence
    order; any strides, so a [num_pages, page_size, Hkv, E] pool passes as
    pool.transpose(1, 2) without a copy); key j of sequence b is row
    j % page_size of page block_table[b, j // page_size]. Needs
    key_value_seq_lengths [B] (the keys each sequence holds, at most
    max_pages * page_size); only the entries of a sequence's first
    ceil(len / page_size) pages are read and must lie in [0, num_pages).
    is_causal (with causal_alignment='bottom_right' for decoding),
    local_window_size, the lengths, sinks, softcap and alibi_slopes apply;
    attn_mask, segment ids, rel_table and dropout do not.

    key_format, value_format, key_scales, value_scales: a quantized KV cache
    as fmha.attention reads it, in SDPA's order: query [B, H, L, E], key
    and value [B, Hkv, S, row] ("int8": int8, key_scales float32 [B, Hkv,
    S]; "fp8_e4m3" / "fp8_e5m2": uint8 bits or torch.float8 tensors, scales
    [Hkv] or None; "q8_0" / "q4_0": uint8 GGUF blocks, row E / 32 x 34 or
    18), page pools [num_pages, Hkv, page_size, row] with block_table (int8
    scales [num_pages, Hkv, page_size]). fmha.torch.quantize_kv writes
    them. Forward only and outside autograd and torch.compile's graphs
    (the call runs through the NumPy binding); attn_mask, dropout and
    segment ids do not apply. precision is fmha.attention's (None: 'fast',
    the query quantized as llama.cpp does; 'accurate' keeps it float32).

    Paged caches and caches of their own dtype have no backward: a backward
    through such a call raises FmhaError (FMHA_ERR_UNSUPPORTED).
    """
    if key_format is not None or value_format is not None:
        return _quantized_cache_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, key_format, value_format,
            key_scales, value_scales, dict(alibi_slopes=alibi_slopes, softcap=softcap,
                                           causal_alignment=causal_alignment, local_window_size=local_window_size,
                                           query_seq_lengths=query_seq_lengths,
                                           key_value_seq_lengths=key_value_seq_lengths, sinks=sinks,
                                           block_table=block_table, precision=precision),
            segment_ids is not None or rel_table is not None)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fmha.torch: {name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_cpu:
            raise ValueError(f"fmha.torch: {name} is on {t.device}; fmha runs on CPU tensors")
    if torch.is_autocast_enabled("cpu"):
        _dtype_code(query), _dtype_code(key), _dtype_code(value)
    else:
        _kv_dtype(query, key, value)
    nd = query.dim()
    if not (nd == key.dim() == value.dim()) or nd < 2:
        raise ValueError("fmha.torch: query, key and value must be [..., H, L, E] with the same number of "
                         f"dimensions (at least 2), got shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}")
    if block_table is not None and nd != 4:
        raise ValueError("fmha.torch: block_table needs query [B, H, L, E] and page pools key and value "
                         f"[num_pages, Hkv, page_size, E], got shapes {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}")
    # Leading dims (all but the last three) flatten into one batch dim:
    # [..., H, L, E] -> [B, H, L, E], a view where the strides allow. Page
    # pools have their own first dim (num_pages).
    lead = (query.shape[0],) if nd == 4 else tuple(query.shape[:-3])
    if block_table is None and (key.shape[:-3] != lead or value.shape[:-3] != lead):
        # leading dims broadcast as SDPA's matmuls broadcast them: each
        # tensor expanded (a view of stride 0 along its size-1 dims)
        try:
            lead = tuple(torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3]))
        except RuntimeError:
            raise ValueError(f"fmha.torch: the leading dims of query, key and value must broadcast, got shapes "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}") from None
        query, key, value = (t.expand(lead + tuple(t.shape[-3:])) for t in (query, key, value))
    if nd == 4:  # [B, H, L, E] as it is
        q, k, v = query, key, value
    else:
        q, k, v = (t.reshape((math.prod(t.shape[:-3]),) + (1,) * max(0, 3 - nd) + tuple(t.shape[-min(nd, 3):]))
                   for t in (query, key, value))
    B, H, L, E = q.shape
    if k.shape[3] != E or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"fmha.torch: inconsistent shapes query {tuple(query.shape)}, key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}")
    Hkv, S = k.shape[1], k.shape[2]
    if _CausalBias is not None and isinstance(attn_mask, _CausalBias):  # SDPA's own causal masks
        if is_causal:
            raise ValueError("fmha.torch: a CausalBias attn_mask should not be used with is_causal=True")
        if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != (L, S):
            raise ValueError(f"fmha.torch: CausalBias for {attn_mask.seq_len_q} queries and {attn_mask.seq_len_kv} "
                             f"keys, got L {L} and S {S}")
        lower_right = attn_mask.variant == _CausalVariant.LOWER_RIGHT
        is_causal, causal_alignment, attn_mask = True, "bottom_right" if lower_right else "top_left", None
    table = None
    if block_table is not None:
        if key_value_seq_lengths is None:
            raise ValueError("fmha.torch: block_table needs key_value_seq_lengths (the keys each sequence holds)")
        table = torch.from_numpy(api.block_table_array(
            block_table.detach().cpu().numpy() if isinstance(block_table, torch.Tensor) else block_table, B))
        S = table.shape[1] * k.shape[2]  # the most keys a sequence can hold
    if H == 0 or Hkv == 0:
        if H != Hkv:
            raise ValueError(f"fmha.torch: query has {H} heads and key {Hkv}")
    elif Hkv != H and not enable_gqa and Hkv != 1:  # one key head broadcasts over the query's, as in SDPA
        raise ValueError(f"fmha.torch: query has {H} heads and key {Hkv}; pass enable_gqa=True for grouped-query "
                         "attention")
    if Hkv and H % Hkv != 0:
        raise ValueError(f"fmha.torch: query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    scale = api.resolve_scale(scale, E)

    bias = mask = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"fmha.torch: attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        if not attn_mask.is_cpu:
            raise ValueError(f"fmha.torch: attn_mask is on {attn_mask.device}; fmha runs on CPU tensors")
        m = _flat_mask(attn_mask, lead, B, (H, L, S) if nd > 2 else (L, S))
        m = m.reshape((m.shape[0],) + (1,) * (4 - m.dim()) + tuple(m.shape[1:]))
        api.broadcast_strides(tuple(m.shape), (1, 1, 1, 1), (B, H, L, S), "attn_mask", given=attn_mask.shape)
        if m.dtype == torch.bool:
            mask = m if all(st >= 0 for st in m.stride()) else m.contiguous()
        elif m.is_floating_point():
            bias = m.float()
            if bias.requires_grad and any(st == 0 and n > 1 for st, n in zip(bias.stride(), bias.shape)):
                # an expanded view: its gradient has an element per position
                # (the library sums over broadcast dims only where the mask
                # has size 1), so the view is materialised
                bias = bias.contiguous()
        else:
            raise TypeError(f"fmha.torch: attn_mask must be boolean or floating point, got {attn_mask.dtype}")
    causal = api.causal_code(bool(is_causal), causal_alignment)
    precision_value = api.precision_code(precision, _framework_precision(q.dtype), "fmha.torch")
    window = [-1, -1] if local_window_size is None else list(api.window_sides(local_window_size))
    softcap = api.softcap_value(softcap) if softcap is not None else None
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"fmha.torch: dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_seed is None:  # drawn from torch's default generator, as SDPA's dropout is
        dropout_seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64)) if dropout_p > 0 else 0
    for name, value in (("dropout_seed", dropout_seed), ("dropout_offset", dropout_offset)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _spec.DROPOUT_COUNTER_LIMIT:
            raise ValueError(f"fmha.torch: {name} must be an integer in [0, 2**64), got {value!r}")
    # the op carries int64: the upper half travels as its two's complement (the C field is uint64)
    dropout_seed, dropout_offset = (v - 2**64 if v >= 2**63 else v for v in (dropout_seed, dropout_offset))

    ql = kl = q_ids = kv_ids = alibi = rel = sink = None
    if query_seq_lengths is not None:
        ql = _int32_operand(query_seq_lengths, lead, B,
                            lambda a: api._int32_vector(a.reshape(-1), B, L, "query_seq_lengths"))
    if key_value_seq_lengths is not None:
        kl = _int32_operand(key_value_seq_lengths, lead, B,
                            lambda a: api._int32_vector(a.reshape(-1), B, S, "key_value_seq_lengths"))
    if segment_ids is not None:
        if isinstance(segment_ids, (tuple, list)) and len(segment_ids) == 2:
            q_seg, kv_seg = segment_ids
        elif L != S:
            raise ValueError("fmha.torch: one segment_ids tensor needs L == S; pass (q_segment_ids, "
                             "kv_segment_ids) otherwise")
        else:
            q_seg = kv_seg = segment_ids
        q_ids = _int32_operand(q_seg, lead, B, lambda a: api._int32_matrix(a, (B, L), "q_segment_ids"))
        kv_ids = _int32_operand(kv_seg, lead, B, lambda a: api._int32_matrix(a, (B, S), "kv_segment_ids"))
    if alibi_slopes is not None:
        alibi = _float32_param(alibi_slopes, (H,), "alibi_slopes (one per query head)")
    if rel_table is not None:
        t = rel_table if isinstance(rel_table, torch.Tensor) else torch.as_tensor(rel_table)
        if t.dim() != 2 or t.shape[1] < 1:
            raise ValueError(f"fmha.torch: rel_table must have shape ({H}, num_buckets), got {tuple(t.shape)}")
        rel = _float32_param(t, (H, t.shape[1]), "rel_table")
    if sinks is not None:
        sink = _float32_param(sinks, (H,), "sinks (one logit per query head)")
        if not bool(torch.isfinite(sink).all()):
            raise ValueError("fmha.torch: sinks must be finite")
    if B * H * L * v.shape[3] == 0 or S == 0:
        out = _EmptyAttention.apply((B, H, L, v.shape[3]), q, k, v, bias, alibi, rel, sink)
        return out if nd == 4 else out.reshape(tuple(query.shape[:-1]) + (v.shape[3],))
    out = _attention(*AttentionArgs(
        q, k, v, bias=bias, mask=mask, q_lengths=ql, kv_lengths=kl, q_ids=q_ids, kv_ids=kv_ids, alibi=alibi,
        rel_table=rel, sinks=sink, causal=causal, scale=float(scale), window=window, softcap=softcap or 0.0,
        rel_options=[int(rel_max_distance), int(bool(rel_bidirectional))], precision=precision_value,
        dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset, block_table=table))
    return out if nd == 4 else out.reshape(tuple(query.shape[:-1]) + (v.shape[3],))


# ---- transformers ---------------------------------------------------------------------------

def transformers_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                           **kwargs):
    """transformers' attention-function signature (that of its "sdpa"):
    query [B, H, L, E], key / value [B, Hkv, S, E] (GQA served natively),
    attention_mask a 4-D boolean or additive mask or None; returns
    ([B, L, H, Ev], None). Causal without a mask follows the module's
    is_causal, top-left as SDPA (L == 1, decode, sees every cached key).
    softcap and s_aux (attention sinks, gpt-oss) are honoured."""
    if kwargs.get("position_bias") is not None:
        raise ValueError("fmha.torch: transformers' position_bias is not supported; pass it as attention_mask")
    L = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    is_causal = L > 1 and attention_mask is None and bool(is_causal)
    if attention_mask is not None and attention_mask.dtype not in (torch.bool, torch.float32):
        attention_mask = attention_mask.float()
    sinks = kwargs.get("s_aux")
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                       is_causal=is_causal, scale=scaling, enable_gqa=key.shape[1] != query.shape[1],
                                       softcap=kwargs.get("softcap"), sinks=sinks)
    return out.transpose(1, 2).contiguous(), None


def register_transformers(name="fmha"):
    """Registers fmha with transformers as attn_implementation=`name`: the
    attention function above in AttentionInterface and transformers' own
    SDPA mask builder (4-D boolean masks, None when causal alone) in
    AttentionMaskInterface. Then AutoModel*.from_config(cfg,
    attn_implementation="fmha") runs its attention through fmha."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:
        raise ImportError("fmha.torch.register_transformers needs transformers (pip install transformers)") from e
    AttentionInterface.register(name, transformers_attention)
    AttentionMaskInterface.register(name, sdpa_mask)

