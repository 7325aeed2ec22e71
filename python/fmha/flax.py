"""fmha.flax: an attention_fn for flax's attention modules, served by
fmha.jax (fmha's C kernels through JAX's FFI).

    import flax.linen as nn, fmha.flax
    nn.MultiHeadDotProductAttention(num_heads=8, attention_fn=fmha.flax.dot_product_attention)
    nnx.MultiHeadAttention(..., attention_fn=fmha.flax.dot_product_attention, rngs=rngs)

It takes the arguments flax passes (those of flax.linen and flax.nnx
dot_product_attention) and fmha's own keywords on top, fixed with
functools.partial (e.g. partial(fmha.flax.dot_product_attention,
softcap=50.0)). flax itself is not imported here.
"""

import jax.numpy as jnp

from . import jax as fmha_jax

__all__ = ["dot_product_attention"]


def _merge_batch(x, batch_shape):
    """[batch..., a, b, c] as [prod(batch), a, b, c]; x's missing or size-1
    batch dimensions broadcast. x without batch dimensions stays as it is."""
    if x.ndim <= 3:
        return x
    x = x.reshape((1,) * (len(batch_shape) + 3 - x.ndim) + x.shape)
    x = jnp.broadcast_to(x, tuple(batch_shape) + x.shape[-3:])
    return x.reshape((-1,) + x.shape[-3:])


def dot_product_attention(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
                          dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None,
                          is_causal=False, force_fp32_for_softmax=False, einsum_dot_general=None,
                          qk_attn_weights_einsum=None, attn_weights_value_einsum=None, promote_dtype=None,
                          fmha_precision=None, **fmha_kwargs):
    """flax's dot_product_attention computed by fmha.

    query [batch..., T, N, H], key and value [batch..., S, K, H] (K divides
    N: GQA), bias and mask broadcastable to [batch..., N, T, S]; returns
    [batch..., T, N, Hv]. bias is differentiable. dtype casts q, k, v (flax's
    computation dtype; default: their promoted dtype); precision (a lax
    dot precision, which flax always passes) is ignored: fmha accumulates
    in float32, and fmha_precision is fmha.jax's precision ('fast',
    'accurate', 'bf16x3', 'bf16'; None: fmha.jax's default). fmha_kwargs go to fmha.jax.dot_product_attention
    (sinks, softcap, segment_ids, ...).

    Dropout (dropout_rate > 0, deterministic False) is fmha's: the weights
    are dropped by a hash of a seed drawn from dropout_rng (see
    fmha.jax.dot_product_attention) and of each score's index, so the
    draws are independent across batch entries and heads
    (broadcast_dropout is not followed) and differ from flax's own.

    force_fp32_for_softmax is accepted and changes nothing: fmha's softmax
    is float32 whatever the dtype. promote_dtype (flax.nnx's) casts q, k
    and v as nnx does, promote_dtype((q, k, v), dtype=dtype), in place of
    the cast above.

    Not supported: module (flax's sow_weights), which needs the attention
    weights that fmha never forms, and einsum_dot_general,
    qk_attn_weights_einsum and attn_weights_value_einsum (products of the
    caller's own, which fmha's fused kernels cannot run): each a clear
    error when given. Rows that see no key get the mean of every value, as
    flax's (fmha.jax.dot_product_attention).
    """
    dropout = {}
    if dropout_rate > 0.0 and not deterministic:
        if dropout_rng is None:
            raise ValueError("fmha.flax: dropout_rate > 0 with deterministic=False needs dropout_rng")
        dropout = dict(dropout_p=dropout_rate, dropout_rng=dropout_rng)
    if module is not None:
        raise NotImplementedError("fmha.flax: sow_weights needs the attention weights, which fmha does not form")
    hooks = dict(einsum_dot_general=einsum_dot_general, qk_attn_weights_einsum=qk_attn_weights_einsum,
                 attn_weights_value_einsum=attn_weights_value_einsum)
    given = [name for name, hook in hooks.items() if hook is not None]
    if given:
        raise NotImplementedError(f"fmha.flax: {', '.join(given)} cannot run inside fmha's fused kernels; "
                                  f"use flax's own dot_product_attention for custom products")
    if promote_dtype is not None:
        query, key, value = promote_dtype((query, key, value), dtype=dtype)
    else:
        dtype = dtype or jnp.result_type(query, key, value)
        query, key, value = (jnp.asarray(x, dtype) for x in (query, key, value))
    out_shape = query.shape[:-1] + value.shape[-1:]
    if query.ndim > 4:
        batch_shape = query.shape[:-3]
        query, key, value = (_merge_batch(x, batch_shape) for x in (query, key, value))
        bias, mask = (None if x is None else _merge_batch(jnp.asarray(x), batch_shape) for x in (bias, mask))
    if mask is not None:
        mask = jnp.asarray(mask).astype(jnp.bool_)
    out = fmha_jax.dot_product_attention(query, key, value, bias, mask, is_causal=is_causal,
                                         precision=fmha_precision, **dropout, **fmha_kwargs)
    return out.reshape(out_shape)
