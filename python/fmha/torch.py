"""fmha.torch: torch.nn.functional.scaled_dot_product_attention's signature,
served by fmha's C kernels on CPU tensors.

The custom ops fmha::attention and fmha::attention_backward (torch.library)
call the C library through ctypes on the tensors' data pointers, with
[B, H, L, E] strides passed as they are (no copies for permuted or
broadcast inputs), through fmha plans cached per shapes, strides, dtype
and options (_PLANS, bounded). register_autograd makes the pair
differentiable (query, key, value and a float attn_mask); register_fake
gives torch.compile the output shapes, so compiled graphs keep the op as
one opaque call.

Rows that see no key at all (a boolean attn_mask that is all False on a
row) give zeros here, where PyTorch gives NaN.

flex_attention (PyTorch's BlockMask; ALiBi and softcap as fmha_bias) lives
in _torch_flex.py, on the plans and helpers here.
"""

import ctypes
import math
from typing import Optional

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.torch needs PyTorch (pip install torch); fmha's NumPy and JAX bindings "
                      "work without it") from e

from . import _lib, api
from ._lib import FmhaError

__all__ = ["scaled_dot_product_attention", "flex_attention", "FmhaError"]

_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}


def _dtype_code(t):
    if t.dtype not in _DTYPES:
        raise TypeError(f"fmha.torch: unsupported dtype {t.dtype}; use float32, bfloat16 or float16")
    return _DTYPES[t.dtype]


def _seq_strides(t):
    """[batch, seq, head, dim] element strides of a [B, H, L, E] tensor."""
    s = t.stride()
    return (s[0], s[2], s[1], s[3])


def _mask_strides(t, full, name):
    return api.broadcast_strides(tuple(t.shape), t.stride(), full, name)


def _problem(q, k, v, o_strides, bias, mask, is_causal, scale, alibi=None, softcap=0.0):
    B, H, L, E = q.shape
    _, Hkv, S, Ev = v.shape
    p = api.new_problem(_dtype_code(q), (B, H, Hkv, L, S, E, Ev), _seq_strides(q), _seq_strides(k),
                        _seq_strides(v), o_strides, scale=scale,
                        causal=_lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE,
                        strategy=_lib.STRATEGIES["auto"])
    full = (B, H, L, S)
    if bias is not None:
        api.set_dense_bias(p, bias.data_ptr(), _mask_strides(bias, full, "attn_mask"))
    if mask is not None:
        api.set_dense_mask(p, mask.data_ptr(), _mask_strides(mask, full, "attn_mask"))
    if alibi is not None:
        p.biases.alibi_slopes = api._ptr(ctypes.c_float, alibi.data_ptr())
    p.biases.softcap = softcap
    return p


# Plans by everything the C problem holds: shapes, strides, dtype, options
# and, for a mask or bias, its address. The address makes a call whose
# mask moved miss (and plan anew); a plan is run only when the call's mask
# sits where the plan reads it, so a stale address is never read.
_PLANS = _lib.PlanCache(32)


def _operand_key(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride())


def _plan(q, k, v, o, bias, mask, is_causal, scale, alibi=None, softcap=0.0):
    key = (q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), o.stride(), is_causal,
           scale, _operand_key(bias), _operand_key(mask), _operand_key(alibi), softcap)
    return _PLANS.get(key, lambda: _problem(q, k, v, _seq_strides(o), bias, mask, is_causal, scale, alibi,
                                            softcap))


def _with_layout(x, like):
    """x copied into a tensor laid out as `like`."""
    y = torch.empty_like(like)
    y.copy_(x)
    return y


def _backward_operands(q, k, v, o, lse, d_o):
    """q, k, v, o, lse, d_o laid out for fmha_backward, and empty dq, dk, dv.

    dQ, dK, dV take the strides of Q, K, V and dO those of O: the inputs are
    arranged so that fresh gradient tensors can share them."""
    grads = []
    arranged = []
    for x in (q, k, v):
        g = torch.empty_like(x)
        if g.stride() != x.stride():
            x = _with_layout(x, g)
        arranged.append(x)
        grads.append(g)
    if not o.is_contiguous() and torch.empty_like(o).stride() != o.stride():
        o = _with_layout(o, torch.empty_like(o))
    if d_o.dtype != o.dtype or d_o.stride() != o.stride():
        d_o = _with_layout(d_o, o)
    return (*arranged, o, lse.contiguous(), d_o, grads)


@torch.library.custom_op("fmha::attention", mutates_args=(), device_types="cpu")
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor],
                  mask: Optional[torch.Tensor], is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, bias, mask, is_causal, scale)


def _outputs(q, v):
    """Empty O [B, H, L, Ev] and lse [B, H, L] float32."""
    B, H, L, _ = q.shape
    return q.new_empty((B, H, L, v.shape[3])), q.new_empty((B, H, L), dtype=torch.float32)


def _forward(q, k, v, bias, mask, is_causal, scale, alibi=None, softcap=0.0):
    """(O, lse) of the plan for these operands and options."""
    out, lse = _outputs(q, v)
    plan = _plan(q, k, v, out, bias, mask, is_causal, scale, alibi, softcap)
    plan.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
    return out, lse


@_attention_op.register_fake
def _attention_fake(q, k, v, bias, mask, is_causal, scale):
    return _outputs(q, v)


@torch.library.custom_op("fmha::attention_backward", mutates_args=(), device_types="cpu")
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                           lse: torch.Tensor, d_o: torch.Tensor, bias: Optional[torch.Tensor],
                           mask: Optional[torch.Tensor], is_causal: bool, scale: float,
                           bias_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o, lse, d_o, (dq, dk, dv) = _backward_operands(q, k, v, o, lse, d_o)
    plan = _plan(q, k, v, o, bias, mask, is_causal, scale)
    param_grads = None
    d_bias = q.new_empty((0,), dtype=torch.float32)
    if bias_grad and bias is not None:
        d_bias = torch.zeros(bias.shape, dtype=torch.float32)
        param_grads = _lib.fmha_param_grads()
        param_grads.d_dense = ctypes.cast(ctypes.c_void_p(d_bias.data_ptr()), ctypes.POINTER(ctypes.c_float))
        B, H, L, _ = q.shape
        param_grads.d_dense_strides[:] = _mask_strides(d_bias, (B, H, L, k.shape[2]), "attn_mask")
    plan.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(), lse.data_ptr(),
                  dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), param_grads)
    return dq, dk, dv, d_bias


@_attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, o, lse, d_o, bias, mask, is_causal, scale, bias_grad):
    d_bias = (q.new_empty(bias.shape, dtype=torch.float32) if bias_grad and bias is not None
              else q.new_empty((0,), dtype=torch.float32))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), d_bias


def _setup_context(ctx, inputs, output):
    """Saves the tensor inputs (None included) in order, then the outputs;
    the other inputs, in order, go to ctx.options."""
    is_tensor = [x is None or isinstance(x, torch.Tensor) for x in inputs]
    ctx.save_for_backward(*(x for x, t in zip(inputs, is_tensor) if t), *output)
    ctx.options = [x for x, t in zip(inputs, is_tensor) if not t]


def _backward(ctx, d_o, d_lse):
    q, k, v, bias, mask, o, lse = ctx.saved_tensors
    is_causal, scale = ctx.options
    want_bias = bias is not None and ctx.needs_input_grad[3]
    dq, dk, dv, d_bias = torch.ops.fmha.attention_backward(q, k, v, o, lse, d_o, bias, mask, is_causal, scale,
                                                           want_bias)
    return dq, dk, dv, d_bias if want_bias else None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _checked_inputs(query, key, value, enable_gqa):
    """query, key, value checked as SDPA takes them, as 4-D tensors, and
    whether they came 4-D."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fmha.torch: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(f"fmha.torch: {name} is on {t.device}; fmha runs on CPU tensors")
        _dtype_code(t)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"fmha.torch: query, key and value must share a dtype, got {query.dtype}, {key.dtype}, "
                        f"{value.dtype}")
    if not (query.dim() == key.dim() == value.dim()) or query.dim() not in (3, 4):
        raise ValueError("fmha.torch: query, key and value must all be [B, H, L, E] (4-D) or [H, L, E] (3-D), got "
                         f"shapes {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    batched = query.dim() == 4
    q, k, v = (query, key, value) if batched else (query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0))
    B, H, L, E = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[3] != E or v.shape[1:3] != k.shape[1:3]:
        raise ValueError(f"fmha.torch: inconsistent shapes query {tuple(query.shape)}, key {tuple(key.shape)}, "
                         f"value {tuple(value.shape)}")
    Hkv = k.shape[1]
    if Hkv != H and not enable_gqa:
        raise ValueError(f"fmha.torch: query has {H} heads and key {Hkv}; pass enable_gqa=True for grouped-query "
                         "attention")
    if H % Hkv != 0:
        raise ValueError(f"fmha.torch: query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    return q, k, v, batched


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention by fmha's C kernels.

    query [B, H, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (or 3-D
    without B) on CPU, float32, bfloat16 or float16. attn_mask: boolean
    (True = take part) or additive float, broadcastable to [B, H, L, S];
    its gradient is returned when it requires one. is_causal is top-left
    aligned and may be combined with attn_mask. enable_gqa allows
    H % Hkv == 0 with Hkv < H. dropout_p must be 0.
    """
    if dropout_p != 0.0:
        raise ValueError(f"fmha.torch: dropout is not supported (dropout_p must be 0.0, got {dropout_p})")
    q, k, v, batched = _checked_inputs(query, key, value, enable_gqa)
    B, H, L, E = q.shape
    S = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(E)
    scale = api.resolve_scale(scale, E)

    bias = mask = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(f"fmha.torch: attn_mask must be a torch.Tensor, got {type(attn_mask).__name__}")
        if attn_mask.dim() > 4:
            raise ValueError(f"fmha.torch: attn_mask must broadcast to [B, H, L, S], got {tuple(attn_mask.shape)}")
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        api.broadcast_strides(tuple(m.shape), (1, 1, 1, 1), (B, H, L, S), "attn_mask")
        if m.dtype == torch.bool:
            mask = m if all(st >= 0 for st in m.stride()) else m.contiguous()
        elif m.is_floating_point():
            bias = m.float()
        else:
            raise TypeError(f"fmha.torch: attn_mask must be boolean or floating point, got {attn_mask.dtype}")
    out, _ = torch.ops.fmha.attention(q, k, v, bias, mask, bool(is_causal), float(scale))
    return out if batched else out.squeeze(0)


from ._torch_flex import flex_attention  # noqa: E402  (it uses the ops above)
