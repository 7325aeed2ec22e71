"""Ring attention (context parallelism) for fmha.torch over torch.distributed.

Each rank holds a contiguous slice of Q, K and V along the sequence. The K/V
slices travel around the ring (rank r sends to r + 1, receives from r - 1)
with isend/irecv posted before the block in hand is computed, so the
transfer overlaps fmha's forward op on it; partial results merge by
log-sum-exp. The backward is a second ring driven by the GLOBAL O and lse:
per-block fmha backward ops add dQ locally, and each block's float32 dK/dV
accumulator travels with it and arrives home after a full turn.
"""

import torch
import torch.distributed as dist

from . import _spec, api
from ._torch_core import PARAMS, attention_args, backward_args

_KV_TAG, _GRAD_TAG = 17, 18   # two messages may travel between the same pair at once


class _Ring:
    """The neighbours of this rank in `group` (global ranks, for send/recv)."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        glob = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = glob((self.rank + 1) % self.size)
        self.prev = glob((self.rank - 1) % self.size)

    def pass_on(self, send, recv, tag):
        """Posts send -> next and recv <- prev; returns the requests to wait on."""
        return [dist.isend(send, self.next, group=self.group, tag=tag),
                dist.irecv(recv, self.prev, group=self.group, tag=tag)]


def _wait(requests):
    for r in requests:
        r.wait()


def _unpack(flat, shapes):
    """The tensors of `shapes` laid one after another in the 1-D `flat`."""
    out, at = [], 0
    for shape in shapes:
        n = torch.Size(shape).numel()
        out.append(flat[at:at + n].view(shape))
        at += n
    return out


def _merge(o_a, lse_a, o_b, lse_b):
    """Log-sum-exp merge of partial results. o: [B, H, L, Ev] float32, lse:
    [B, H, L]; rows where both lse are -inf give O = 0."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.where(torch.isneginf(lse_a), torch.zeros_like(lse), torch.exp(lse_a - safe))
    w_b = torch.where(torch.isneginf(lse_b), torch.zeros_like(lse), torch.exp(lse_b - safe))
    return w_a.unsqueeze(-1) * o_a + w_b.unsqueeze(-1) * o_b, lse


def _block_causal(ring, step, is_causal):
    """The causal code of the block in hand at `step` (the K/V slice of rank
    - step, mod size), or None when the block is skipped."""
    if not is_causal:
        return _spec.CAUSAL_NONE
    if step == 0:
        return _spec.CAUSAL_TOP_LEFT
    return _spec.CAUSAL_NONE if ring.rank >= step else None  # earlier rank, or a later one (wrapped)


def _prefetch(ring, kv, step):
    """Posts the transfer of the K/V block used after `step`: (requests, its buffer)."""
    if step + 1 == ring.size:
        return [], None
    incoming = torch.empty_like(kv)
    return ring.pass_on(kv, incoming, _KV_TAG), incoming


def _ring_forward(ring, q, k, v, is_causal, options):
    B, H, L, _ = q.shape
    shapes = (k.shape, v.shape)
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])  # [numel(k) + numel(v)], travels around the ring
    o = torch.zeros((B, H, L, v.shape[3]), dtype=torch.float32)
    lse = torch.full((B, H, L), -float("inf"), dtype=torch.float32)
    for step in range(ring.size):
        pending, incoming = _prefetch(ring, kv, step)
        causal = _block_causal(ring, step, is_causal)
        if causal is not None:
            k_b, v_b = _unpack(kv, shapes)
            o_b, lse_b = torch.ops.fmha.attention(*attention_args(q, k_b, v_b, causal=causal, **options))
            o, lse = _merge(o, lse, o_b.float(), lse_b)
        _wait(pending)
        kv = incoming
    return o.to(q.dtype), lse


def _ring_backward(ring, q, k, v, o, lse, d_o, is_causal, options):
    shapes = (k.shape, v.shape)
    kv = torch.cat([k.reshape(-1), v.reshape(-1)])
    dq = torch.zeros(q.shape, dtype=torch.float32)
    # [numel(k) + numel(v)] float32: dK, dV of the block in hand, summed over the ranks it has visited
    acc, acc_pending, acc_incoming = None, [], None
    for step in range(ring.size):
        pending, incoming = _prefetch(ring, kv, step)
        causal = _block_causal(ring, step, is_causal)
        grads = None
        if causal is not None:
            k_b, v_b = _unpack(kv, shapes)
            dq_b, dk_b, dv_b, *_ = torch.ops.fmha.attention_backward(
                *backward_args(q, k_b, v_b, o, lse, d_o, causal=causal, wanted=[False] * len(PARAMS), **options))
            dq += dq_b
            grads = torch.cat([dk_b.reshape(-1).float(), dv_b.reshape(-1).float()])
        _wait(acc_pending)  # the accumulator of this block, from the previous rank
        if acc_incoming is None:
            acc = grads if grads is not None else torch.zeros(kv.numel(), dtype=torch.float32)
        else:
            acc = acc_incoming if grads is None else acc_incoming + grads
        if ring.size > 1:
            acc_incoming = torch.empty_like(acc)
            acc_pending = ring.pass_on(acc, acc_incoming, _GRAD_TAG)  # the last pass takes it home
        _wait(pending)
        kv = incoming
    if ring.size > 1:
        _wait(acc_pending)
        acc = acc_incoming
    dk, dv = _unpack(acc, shapes)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, is_causal, options):
        o, lse = _ring_forward(ring, q, k, v, is_causal, options)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ring, ctx.is_causal, ctx.options = ring, is_causal, options
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(ctx.ring, q, k, v, o, lse, d_o.to(o.dtype), ctx.is_causal, ctx.options)
        return dq, dk, dv, None, None, None


def ring_attention(query, key, value, group=None, is_causal=False, scale=None):
    """Attention over a sequence split across the ranks of `group`, by a ring.

    Every rank of the torch.distributed group (default: the world; gloo on
    CPU) passes its own contiguous slice, in rank order, of the sequence:
    query [B, H, L_local, E], key [B, Hkv, S_local, E], value [B, Hkv,
    S_local, Ev] (scaled_dot_product_attention's layout; grouped-query when
    Hkv divides H), the same shapes on every rank. Returns this rank's
    queries' output [B, H, L_local, Ev], equal to fmha.torch's attention
    over the concatenated slices. K/V slices rotate around the ring with
    isend/irecv overlapping each block's fmha op; partial results merge by
    log-sum-exp. Differentiable: backward runs the ring again with the
    global O and lse, and dK/dV return to the rank owning the slice. Every
    rank must call it (and its backward) together.

    is_causal: global causal over the concatenation of the slices in rank
    order (query i sees key j <= i); needs L_local == S_local. The diagonal
    block is causal within itself, later ranks' blocks are skipped, earlier
    ones unmasked. scale defaults to 1/sqrt(E). dtypes: float32, bfloat16,
    float16 (merges and dK/dV sums in float32).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("fmha.torch.ring_attention needs an initialized torch.distributed process group")
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("fmha.torch.ring_attention: query, key and value must be torch.Tensors")
    if any(t.dim() != 4 for t in tensors):
        raise ValueError(f"fmha.torch.ring_attention: query, key and value must be 4-D [B, H, L, E], got "
                         f"{query.dim()}, {key.dim()}, {value.dim()} dims")
    B, H, L, E = query.shape
    _, Hkv, S, _ = key.shape
    if key.shape[0] != B or key.shape[3] != E or value.shape[:3] != key.shape[:3] or H % Hkv != 0:
        raise ValueError(f"fmha.torch.ring_attention: inconsistent shapes query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)}")
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"fmha.torch.ring_attention: query, key and value must share a dtype, got "
                         f"{query.dtype}, {key.dtype}, {value.dtype}")
    if is_causal and L != S:
        raise ValueError(f"fmha.torch.ring_attention: is_causal needs equal query and key slices, got {L} and {S}")
    # the ops' options besides causal, which each block sets
    options = dict(scale=float(api.resolve_scale(scale, E)), window=list(api.window_sides(None)), softcap=0.0,
                   rel_options=[128, 1], precision=api.PRECISIONS["fast"], dropout_p=0.0, dropout_seed=0,
                   dropout_offset=0)
    return _RingAttentionFunction.apply(query, key.contiguous(), value.contiguous(), _Ring(group), bool(is_causal),
                                        options)
