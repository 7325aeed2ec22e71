"""Ring attention (context parallelism) for fmha.jax, used inside shard_map.

Each device holds a contiguous slice of Q, K and V along the sequence. The
K/V slices rotate around the ring (jax.lax.ppermute) while each device runs
fmha's forward custom call for its queries against the slice in hand; the
partial results merge by log-sum-exp. The backward is a second ring driven
by the GLOBAL O and lse: per-block fmha backward calls add dQ locally, and
the dK/dV accumulators travel with their K/V block back to its owner.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib, _spec, api
from ._jax_core import _Config, _backward, _ensure_registered, _forward

_NO_EXTRAS = dict.fromkeys(_spec.EXTRA_NAMES)


def _ring_size(axis_name):
    size = getattr(jax.lax, "axis_size", None)
    return size(axis_name) if size is not None else jax.lax.psum(1, axis_name)


def _shift(x, axis_name, n):
    """Sends x to the next device of the ring (rank r -> r + 1 mod n)."""
    return jax.lax.ppermute(x, axis_name, [(r, (r + 1) % n) for r in range(n)])


def _block_kind(step, rank, causal):
    """0: unmasked, 1: diagonal (causal within the block), 2: skipped. At
    `step` the device `rank` holds the K/V slice of rank - step (mod n)."""
    if not causal:
        return jnp.int32(0)
    if step == 0:
        return jnp.int32(1)
    return jnp.where(rank >= step, 0, 2).astype(jnp.int32)  # source rank rank - step is earlier, or wrapped


def _varying_like(x, like):
    """x typed as varying over the mesh axes `like` varies over (shard_map's
    check of a custom_vjp's gradients; the custom calls' results vary over none)."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None or not hasattr(jax.lax, "pcast"):
        return x

    def varying(a):
        t = typeof(a)
        axes = getattr(t, "manual_axis_type", None)
        return set(axes.varying) if axes is not None else set(getattr(t, "vma", ()))

    missing = tuple(sorted(varying(like) - varying(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _merge(o_a, lse_a, o_b, lse_b):
    """Log-sum-exp merge of two partial results. o: [B, T, N, Hv] float32,
    lse: [B, N, T]; rows where both lse are -inf give O = 0."""
    lse = jnp.logaddexp(lse_a, lse_b)
    safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
    w_a = jnp.where(jnp.isneginf(lse_a), 0.0, jnp.exp(lse_a - safe))
    w_b = jnp.where(jnp.isneginf(lse_b), 0.0, jnp.exp(lse_b - safe))
    to_rows = lambda w: jnp.transpose(w, (0, 2, 1))[..., None]  # [B, N, T] -> [B, T, N, 1]
    return to_rows(w_a) * o_a + to_rows(w_b) * o_b, lse


def _ring_forward(q, k, v, axis_name, cfgs):
    n = _ring_size(axis_name)
    rank = jax.lax.axis_index(axis_name)
    causal = cfgs[1].causal != _spec.CAUSAL_NONE
    B, T, N, _ = q.shape
    Hv = v.shape[-1]
    o = jnp.zeros((B, T, N, Hv), jnp.float32)
    lse = jnp.full((B, N, T), -jnp.inf, jnp.float32)

    def block(kind, k, v):
        def run(cfg):
            def call():
                o_b, lse_b = _forward(q, k, v, _NO_EXTRAS, cfg)
                return o_b.astype(jnp.float32), lse_b
            return call

        def skip():
            return jnp.zeros((B, T, N, Hv), jnp.float32), jnp.full((B, N, T), -jnp.inf, jnp.float32)

        return jax.lax.switch(kind, (run(cfgs[0]), run(cfgs[1]), skip))

    for step in range(n):
        o_b, lse_b = block(_block_kind(step, rank, causal), k, v)
        o, lse = _merge(o, lse, o_b, lse_b)
        if step + 1 < n:
            k, v = _shift(k, axis_name, n), _shift(v, axis_name, n)
    return _varying_like(o.astype(q.dtype), q), _varying_like(lse, q)


def _ring_backward(q, k, v, o, lse, d_o, axis_name, cfgs):
    n = _ring_size(axis_name)
    rank = jax.lax.axis_index(axis_name)
    causal = cfgs[1].causal != _spec.CAUSAL_NONE
    dq = jnp.zeros(q.shape, jnp.float32)
    dk = jnp.zeros(k.shape, jnp.float32)  # travels with k: the gradient of the slice in hand
    dv = jnp.zeros(v.shape, jnp.float32)

    def block(kind, k, v):
        def run(cfg):
            def call():
                return tuple(g.astype(jnp.float32) for g in _backward(q, k, v, o, lse, d_o, _NO_EXTRAS, cfg, ())[:3])
            return call

        def skip():
            return (jnp.zeros(q.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
                    jnp.zeros(v.shape, jnp.float32))

        return jax.lax.switch(kind, (run(cfgs[0]), run(cfgs[1]), skip))

    for step in range(n):
        dq_b, dk_b, dv_b = block(_block_kind(step, rank, causal), k, v)
        dq, dk, dv = dq + dq_b, dk + dk_b, dv + dv_b
        if step + 1 < n:
            k, v = _shift(k, axis_name, n), _shift(v, axis_name, n)
        dk, dv = _shift(dk, axis_name, n), _shift(dv, axis_name, n)  # n shifts in all: home again
    return tuple(_varying_like(g.astype(x.dtype), x) for g, x in ((dq, q), (dk, k), (dv, v)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ring_attention_vjp(q, k, v, axis_name, cfgs):
    return _ring_forward(q, k, v, axis_name, cfgs)[0]


def _ring_attention_fwd(q, k, v, axis_name, cfgs):
    o, lse = _ring_forward(q, k, v, axis_name, cfgs)
    return o, (q, k, v, o, lse)


def _ring_attention_bwd(axis_name, cfgs, res, d_o):
    q, k, v, o, lse = res
    return _ring_backward(q, k, v, o, lse, d_o.astype(o.dtype), axis_name, cfgs)


_ring_attention_vjp.defvjp(_ring_attention_fwd, _ring_attention_bwd)


def ring_attention(query, key, value, *, axis_name, is_causal=False, scale=None):
    """Attention over a sequence sharded along `axis_name`, computed by a ring.

    Call inside jax.shard_map with the sequence dimension of query, key and
    value split over the mesh axis `axis_name` in rank order. Each device
    passes its local slices: query [B, T_local, N, H], key [B, S_local, K, H],
    value [B, S_local, K, Hv] (fmha.jax.dot_product_attention's layout; GQA
    when K divides N); the result is its queries' output [B, T_local, N, Hv],
    equal to dot_product_attention over the concatenated slices. K/V slices
    rotate with jax.lax.ppermute; every block is one fmha forward (backward)
    custom call; partial results merge by log-sum-exp. Differentiable
    (jax.custom_vjp): the backward rotates K/V again with their dK/dV.

    is_causal: global causal over the concatenation of the slices in rank
    order (query i sees key j <= i); needs T_local == S_local. The diagonal
    block is causal within itself, blocks of later ranks are skipped, blocks
    of earlier ranks are unmasked. scale defaults to 1/sqrt(H). dtypes:
    float32, bfloat16, float16 (merges and gradient sums in float32).
    """
    q, k, v = (jnp.asarray(x) for x in (query, key, value))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"fmha.jax.ring_attention: query, key and value must be 4-D [B, L, heads, dim], got "
                         f"{q.ndim}, {k.ndim}, {v.ndim} dims")
    B, S, K, H = k.shape
    if v.shape[:3] != (B, S, K):
        raise ValueError(f"fmha.jax.ring_attention: value shape should be [{B}, {S}, {K}, Hv]: but got {v.shape}")
    if q.shape[0] != B or q.shape[3] != H or q.shape[2] % K != 0:
        raise ValueError(f"fmha.jax.ring_attention: query shape should be [{B}, T, a multiple of {K}, {H}]: "
                         f"but got {q.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"fmha.jax.ring_attention: query, key and value must share a dtype, got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    api.dtype_code(q.dtype)
    if is_causal and q.shape[1] != S:
        raise ValueError(f"fmha.jax.ring_attention: is_causal needs equal query and key slices, got "
                         f"{q.shape[1]} and {S}")
    base = dict(scale=api.resolve_scale(scale, H), window=api.window_sides(None), strategy=_lib.STRATEGIES["auto"],
                softcap=0.0, precision=api.PRECISIONS["fast"], rel_max_distance=128, rel_bidirectional=1,
                dropout_p=0.0)
    unmasked = _Config(causal=_spec.CAUSAL_NONE, **base)
    diagonal = _Config(causal=_spec.CAUSAL_TOP_LEFT if is_causal else _spec.CAUSAL_NONE, **base)
    _ensure_registered()
    return _ring_attention_vjp(q, k, v, axis_name, (unmasked, diagonal))
