"""_torch_core: the custom ops fmha::attention and fmha::attention_backward
(torch.library) that fmha.torch, its flex_attention (_torch_flex) and its
ring attention (_torch_ring) all run: their kernels on the C library
(through cached plans or one-shot calls), fake kernels for torch.compile,
the autograd pair and the autocast kernels, and the small helpers the
three modules share. It sits below the public module so that none of them
imports another that imports it back.

The ops' arguments are named once, in ATTENTION_ARGS and BACKWARD_ARGS:
the schema strings, the AttentionArgs / BackwardArgs tuples callers build
and every position used here come from those lists.
"""

import collections
import ctypes
import operator

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.torch needs PyTorch (pip install torch); fmha's NumPy and JAX bindings "
                      "work without it") from e

import torch.autograd.forward_ad as _forward_ad  # noqa: E402

from . import _lib, api

_DTYPES = {torch.float32: _lib.DTYPE_F32, torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_F16}


def refuse_forward_ad(name, tensors):
    """Raises where a tensor carries a forward-mode tangent (a dual
    tensor): the kernels have no JVP, and the op would drop it silently."""
    if getattr(_forward_ad, "_current_level", -1) >= 0 and any(
            t is not None and _forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError(f"{name}: forward-mode AD (dual tensors) is not supported: the kernels have no "
                                  f"JVP; its tangent would be dropped")


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


# ---- the ops' arguments -------------------------------------------------------------

# Everything of a call besides q, k, v and the outputs, in the custom ops'
# argument order: optional tensors (bias float32 and mask bool broadcast
# to [B, H, L, S]; int32 q_lengths [B], kv_lengths [B], q_ids [B, L],
# kv_ids [B, S]; float32 alibi [H], rel_table [H, buckets], sinks [H]) then
# options (causal: a causal code, _spec; window: [left, right], -1 = open;
# softcap: 0 = off; rel_options: [max_distance, bidirectional]; precision:
# an fmha_precision code; dropout_p, dropout_seed, dropout_offset as in
# fmha_problem, the backward given the forward's), last the forward's
# block_table (int32 [B, max_pages], a paged KV cache; k and v are then
# page pools [num_pages, Hkv, page_size, E]). Types are schema types.
OPTIONAL_TENSORS = ("bias", "mask", "q_lengths", "kv_lengths", "q_ids", "kv_ids", "alibi", "rel_table", "sinks")
OPTIONS = (("causal", "SymInt"), ("scale", "float"), ("window", "SymInt[]"), ("softcap", "float"),
           ("rel_options", "SymInt[]"), ("precision", "SymInt"), ("dropout_p", "float"), ("dropout_seed", "SymInt"),
           ("dropout_offset", "SymInt"))
# The differentiable ones among the optional tensors, in the order of the
# backward's d_* results and of its `wanted` flags.
PARAMS = ("bias", "alibi", "rel_table", "sinks")

ATTENTION_ARGS = (tuple((name, "Tensor") for name in ("q", "k", "v"))
                  + tuple((name, "Tensor?") for name in OPTIONAL_TENSORS) + OPTIONS + (("block_table", "Tensor?"),))
ATTENTION_DEFAULTS = {"block_table": "None"}
BACKWARD_ARGS = (tuple((name, "Tensor") for name in ("q", "k", "v", "o", "lse", "d_o"))
                 + tuple((name, "Tensor?") for name in OPTIONAL_TENSORS) + OPTIONS + (("wanted", "bool[]"),))


def _schema(args, defaults, results):
    """A schema string "(Type name, ...) -> (Tensor, ...)" of `results` tensors."""
    params = ", ".join(f"{kind} {name}" + (f"={defaults[name]}" if name in defaults else "") for name, kind in args)
    return f"({params}) -> ({', '.join(['Tensor'] * results)})"


# The ops' positional arguments by name (a tuple each: splat them into the op).
AttentionArgs = collections.namedtuple("AttentionArgs", [name for name, _ in ATTENTION_ARGS], defaults=(None,))
BackwardArgs = collections.namedtuple("BackwardArgs", [name for name, _ in BACKWARD_ARGS])
_NO_OPTIONAL = dict.fromkeys(OPTIONAL_TENSORS)


def attention_args(q, k, v, **named):
    """fmha::attention's arguments; optional tensors not named are None."""
    return AttentionArgs(q, k, v, **{**_NO_OPTIONAL, **named})


def backward_args(q, k, v, o, lse, d_o, **named):
    """fmha::attention_backward's arguments; optional tensors not named are None."""
    return BackwardArgs(q, k, v, o, lse, d_o, **{**_NO_OPTIONAL, **named})


def _span(fields, first, last):
    """The slice of argument positions from `first` to `last`, both included."""
    return slice(fields.index(first), fields.index(last) + 1)


def _positions(fields, names):
    return tuple(fields.index(name) for name in names)


_TENSORS = _span(AttentionArgs._fields, OPTIONAL_TENSORS[0], OPTIONAL_TENSORS[-1])
_OPTIONS = _span(AttentionArgs._fields, OPTIONS[0][0], OPTIONS[-1][0])
_BLOCK_TABLE = AttentionArgs._fields.index("block_table")
_PARAM_INPUTS = _positions(AttentionArgs._fields, PARAMS)
_param_flags = operator.itemgetter(*_PARAM_INPUTS)  # their needs_input_grad flags
_BACKWARD_SPEC = _span(BackwardArgs._fields, OPTIONAL_TENSORS[0], OPTIONS[-1][0])

# A call's arguments after q, k, v (the forward's; the backward's lack the table).
_Spec = collections.namedtuple("_Spec", AttentionArgs._fields[_TENSORS.start:], defaults=(None,))
_ARRAYS = ("q_lengths", "kv_lengths", "q_ids", "kv_ids", "alibi", "rel_table", "sinks", "block_table")


def _address(t):
    return None if t is None else t.data_ptr()


def _kv_dtype(q, k, v):
    """fmha_kv_dtype of k and v beside q (0: q's dtype); TypeError for a mix fmha does not serve."""
    code = api.kv_dtype_code(_dtype_code(q), _dtype_code(k), _dtype_code(v))
    if code is None:
        raise TypeError(f"fmha.torch: {api.KV_DTYPE_RULE}, got {q.dtype}, {k.dtype}, {v.dtype}")
    return code


def _problem(q, k, v, o_strides, spec):
    B, H, L, E = q.shape
    _, Hkv, S, Ev = v.shape
    table = spec.block_table
    if table is not None:  # k, v: pools [num_pages, Hkv, page_size, E]; _seq_strides gives [page, row, head, dim]
        S = table.shape[1] * k.shape[2]
    p = api.new_problem(_dtype_code(q), (B, H, Hkv, L, S, E, Ev), _seq_strides(q), _seq_strides(k),
                        _seq_strides(v), o_strides, scale=spec.scale, causal=spec.causal,
                        strategy=_lib.STRATEGIES["auto"], window=tuple(spec.window))
    p.kv_dtype = _kv_dtype(q, k, v)
    if table is not None:
        p.block_table = ctypes.cast(ctypes.c_void_p(table.data_ptr()), ctypes.POINTER(ctypes.c_int32))
        p.block_table_stride = table.stride(0)
        p.num_pages, p.page_size = k.shape[0], k.shape[2]
    p.precision = spec.precision
    p.dropout_p, p.dropout_seed, p.dropout_offset = spec.dropout_p, spec.dropout_seed, spec.dropout_offset
    full = (B, H, L, S)
    if spec.bias is not None:
        api.set_dense_bias(p, spec.bias.data_ptr(), _mask_strides(spec.bias, full, "attn_mask"))
    if spec.mask is not None:
        api.set_dense_mask(p, spec.mask.data_ptr(), _mask_strides(spec.mask, full, "attn_mask"))
    rel = spec.rel_table
    api.set_extras(p, q_lengths=_address(spec.q_lengths), kv_lengths=_address(spec.kv_lengths),
                   q_ids=_address(spec.q_ids), kv_ids=_address(spec.kv_ids), alibi=_address(spec.alibi),
                   rel_table=_address(rel), rel_num_buckets=rel.shape[1] if rel is not None else 0,
                   rel_max_distance=spec.rel_options[0], rel_bidirectional=spec.rel_options[1],
                   softcap=spec.softcap if spec.softcap > 0 else None, sinks=_address(spec.sinks))
    return p


# Plans by everything the C problem holds: shapes, strides, dtype, options
# and, for a mask or bias, its address. The address makes a call whose
# mask moved miss (and plan anew); a plan is run only when the call's mask
# sits where the plan reads it, so a stale address is never read. Calls
# with lengths, segment ids, slopes, a table, sinks or dropout (a new seed
# each call) run one-shot (fmha_forward / fmha_backward), planned each call.
_PLANS = _lib.PlanCache(32)


def _operand_key(t):
    return None if t is None else (t.data_ptr(), t.shape, t.stride())


def _plan(q, k, v, o, spec):
    """The cached plan of a call, or None for one that runs one-shot."""
    if (spec.dropout_p > 0 or spec.q_lengths is not None or spec.kv_lengths is not None or spec.q_ids is not None
            or spec.kv_ids is not None or spec.alibi is not None or spec.rel_table is not None
            or spec.sinks is not None or spec.block_table is not None):
        return None
    key = (q.dtype, k.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), o.stride(), spec.causal,
           spec.scale, tuple(spec.window), spec.softcap, spec.precision, _operand_key(spec.bias),
           _operand_key(spec.mask))
    return _PLANS.get(key, lambda: _problem(q, k, v, _seq_strides(o), spec))


def _with_layout(x, like):
    """x copied into a tensor laid out as `like`."""
    y = torch.empty_like(like)
    y.copy_(x)
    return y


def _float_ptr(t):
    return None if t is None else ctypes.cast(ctypes.c_void_p(t.data_ptr()), ctypes.POINTER(ctypes.c_float))


def _attention_impl(q, k, v, *rest):
    """fmha::attention's kernel (arguments as ATTENTION_ARGS): out, lse."""
    spec = _Spec(*rest)
    block_table = spec.block_table
    if block_table is not None:
        if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
            raise ValueError(f"fmha.torch: block_table must be int32 [B, max_pages] with B = {q.shape[0]}, got "
                             f"{block_table.dtype} {tuple(block_table.shape)}")
        spec = spec._replace(block_table=block_table.contiguous())
    out, lse, _ = _forward_run(q, k, v, spec)
    return out, lse


def _new_out(q, Ev):
    """O [B, H, L, Ev] in q's memory order, as PyTorch's SDPA returns it:
    [B, L, H, Ev] memory when q's heads lie within its rows (transformers'
    q = x.transpose(1, 2)), so that out.transpose(1, 2) is contiguous."""
    B, H, L, _ = q.shape
    if H > 1 and L > 1 and q.stride(1) < q.stride(2):
        return q.new_empty((B, L, H, Ev)).transpose(1, 2)
    return q.new_empty((B, H, L, Ev))


def _forward_run(q, k, v, spec):
    """out, lse and the plan that served the call (None: one-shot)."""
    B, H, L, _ = q.shape
    out = _new_out(q, v.shape[3])
    lse = q.new_empty((B, H, L), dtype=torch.float32)
    plan = _plan(q, k, v, out, spec)
    if plan is not None:
        plan.forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
    else:
        p = _problem(q, k, v, _seq_strides(out), spec)
        _lib.check(_lib.load().fmha_forward(ctypes.byref(p), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                            out.data_ptr(), _float_ptr(lse), None, 0), "fmha_forward")
    return out, lse, plan


_attention_op = torch.library.custom_op("fmha::attention", mutates_args=(), device_types="cpu",
                                        schema=_schema(ATTENTION_ARGS, ATTENTION_DEFAULTS, 2))(_attention_impl)


@_attention_op.register_fake
def _attention_fake(q, k, v, *spec):
    B, H, L, _ = q.shape
    return _new_out(q, v.shape[3]), q.new_empty((B, H, L), dtype=torch.float32)


def _zeros_or_empty(t, wanted):
    """float32 zeros shaped as t when its gradient is wanted, else an empty tensor."""
    return torch.zeros(t.shape, dtype=torch.float32) if wanted and t is not None else torch.empty((0,))


def _attention_backward_impl(*args):
    """fmha::attention_backward's kernel (arguments as BACKWARD_ARGS): dq,
    dk, dv, then d_bias, d_alibi, d_rel_table, d_sinks (float32; empty
    where `wanted`, one flag per PARAMS entry in that order, is False)."""
    a = BackwardArgs(*args)
    q, k, v, o, lse, d_o = a.q, a.k, a.v, a.o, a.lse, a.d_o
    spec = _Spec(*args[_BACKWARD_SPEC])
    # dQ, dK, dV take the strides of Q, K, V and dO those of O: arrange the
    # inputs so that fresh gradient tensors can share them.
    grads = []
    arranged = []
    for x in (q, k, v):
        g = torch.empty_like(x)
        if g.stride() != x.stride():
            x = _with_layout(x, g)
        arranged.append(x)
        grads.append(g)
    q, k, v = arranged
    dq, dk, dv = grads
    if not o.is_contiguous() and torch.empty_like(o).stride() != o.stride():
        o = _with_layout(o, torch.empty_like(o))
    if d_o.dtype != o.dtype or d_o.stride() != o.stride():
        d_o = _with_layout(d_o, o)
    lse = lse.contiguous()
    d_bias, d_alibi, d_rel, d_sinks = (_zeros_or_empty(getattr(spec, name), w) for name, w in zip(PARAMS, a.wanted))
    param_grads = None
    if d_bias.numel() or d_alibi.numel() or d_rel.numel():
        param_grads = _lib.fmha_param_grads()
        if d_bias.numel():
            param_grads.d_dense = _float_ptr(d_bias)
            B, H, L, _ = q.shape
            param_grads.d_dense_strides[:] = _mask_strides(d_bias, (B, H, L, k.shape[2]), "attn_mask")
        param_grads.d_alibi = _float_ptr(d_alibi) if d_alibi.numel() else None
        param_grads.d_rel_table = _float_ptr(d_rel) if d_rel.numel() else None
    plan = _plan(q, k, v, o, spec)
    if plan is not None:
        plan.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(), lse.data_ptr(),
                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), param_grads)
    else:
        p = _problem(q, k, v, _seq_strides(o), spec)
        lib = _lib.load()
        _lib.check(lib.fmha_backward(ctypes.byref(p), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                     d_o.data_ptr(), _float_ptr(lse), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                     ctypes.byref(param_grads) if param_grads is not None else None, None, 0),
                   "fmha_backward")
        if d_sinks.numel():
            _lib.check(lib.fmha_sinks_backward(ctypes.byref(p), o.data_ptr(), d_o.data_ptr(), _float_ptr(lse),
                                               _float_ptr(d_sinks)), "fmha_sinks_backward")
    return dq, dk, dv, d_bias, d_alibi, d_rel, d_sinks


_attention_backward_op = torch.library.custom_op("fmha::attention_backward", mutates_args=(), device_types="cpu",
                                                 schema=_schema(BACKWARD_ARGS, {}, 7))(_attention_backward_impl)


@_attention_backward_op.register_fake
def _attention_backward_fake(*args):
    a = BackwardArgs(*args)
    params = (a.q.new_empty(t.shape if w and t is not None else (0,), dtype=torch.float32)
              for t, w in zip((getattr(a, name) for name in PARAMS), a.wanted))
    return (torch.empty_like(a.q), torch.empty_like(a.k), torch.empty_like(a.v), *params)


def _refusal(inputs, q, k):
    """The error a backward raises for a call the C backward cannot serve, or None."""
    return api.forward_only_error(len(inputs) > _BLOCK_TABLE and inputs[_BLOCK_TABLE] is not None, q.dtype,
                                  k.dtype, "fmha.torch.scaled_dot_product_attention",
                                  "run it under torch.no_grad() or detach its inputs")


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, *inputs[_TENSORS])
    ctx.options = inputs[_OPTIONS]
    ctx.refused = _refusal(inputs, q, k)


def _param_grads(ctx, q, k, v, o, lse, tensors, d_o, run):
    """The gradients of the forward op's inputs, by `run` (the backward op
    through the dispatcher, or its kernel); tensors: the optional tensors
    (OPTIONAL_TENSORS, in order)."""
    if ctx.refused is not None:
        raise ctx.refused
    wanted = [ctx.needs_input_grad[i] and tensors[i - _TENSORS.start] is not None for i in _PARAM_INPUTS]
    dq, dk, dv, *params = run(q, k, v, o, lse, d_o, *tensors, *ctx.options, wanted)
    grads = [dq, dk, dv] + [None] * (len(ctx.needs_input_grad) - 3)
    for i, w, g in zip(_PARAM_INPUTS, wanted, params):
        grads[i] = g if w else None
    return tuple(grads)


def _backward(ctx, d_o, d_lse):
    q, k, v, o, lse, *tensors = ctx.saved_tensors
    return _param_grads(ctx, q, k, v, o, lse, tensors, d_o, torch.ops.fmha.attention_backward)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# Autocast on CPU: like PyTorch's SDPA (a lower-precision op), the fmha ops
# run q, k, v (and in the backward o and d_o) in the autocast dtype; masks,
# biases, parameters and lse stay as they are (float32).
_AUTOCAST_KEY = torch._C.DispatchKey.AutocastCPU
_AUTOCAST_LIB = torch.library.Library("fmha", "IMPL")


def _autocast_kernel(op, cast_positions):
    def kernel(keyset, *args):
        dtype = torch.get_autocast_dtype("cpu")
        args = [a.to(dtype) if i in cast_positions and a.is_floating_point() and a.dtype != dtype else a
                for i, a in enumerate(args)]
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST_KEY)):
            return op(*args)
    return kernel


_AUTOCAST_LIB.impl("attention", _autocast_kernel(torch.ops.fmha.attention.default,
                                                 _positions(AttentionArgs._fields, ("q", "k", "v"))),
                   "AutocastCPU", with_keyset=True)
_AUTOCAST_LIB.impl("attention_backward",
                   _autocast_kernel(torch.ops.fmha.attention_backward.default,
                                    _positions(BackwardArgs._fields, ("q", "k", "v", "o", "d_o"))),
                   "AutocastCPU", with_keyset=True)


def _float32_param(x, shape, name):
    """x (a tensor keeps its autograd graph) as a contiguous float32 tensor of `shape`."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    if not t.is_cpu:
        raise ValueError(f"fmha.torch: {name} is on {t.device}; fmha runs on CPU tensors")
    if t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"fmha.torch: {name} must be real, got dtype {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"fmha.torch: {name} must have shape {shape}, got {tuple(t.shape)}")
    return t.float().contiguous()

