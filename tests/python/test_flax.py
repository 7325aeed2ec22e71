"""test_flax: fmha.flax.dot_product_attention as the attention_fn of flax's
linen MultiHeadDotProductAttention and nnx MultiHeadAttention: outputs and
gradients (inputs and every parameter) against the same model with flax's
own attention; masks (padded rows that see no key too), causal, GQA, extra
batch dimensions, bf16; dropout against flax's weights times fmha's draw;
the sow_weights error. Skipped when flax is not installed."""

import functools

import numpy as np
import pytest

jax = pytest.importorskip("jax")
flax = pytest.importorskip("flax", reason="flax is not installed (pip install flax)")
import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import fmha.flax as ff  # noqa: E402

from conftest import rel_error, uniform  # noqa: E402

TOL = 2e-5


def assert_trees_close(a, b):
    """Each leaf of a within TOL of b's, relative to the norm of the whole
    tree b (the key projection's bias has a zero gradient, softmax being
    blind to a constant added to a row, so both sides hold rounding noise)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    total = np.sqrt(sum(np.sum(np.asarray(y, np.float64) ** 2) for y in lb))
    for x, y in zip(la, lb):
        assert x.shape == y.shape
        assert np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64)) < TOL * total


def linen_model(attention_fn):
    return nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32, attention_fn=attention_fn)


@pytest.mark.parametrize("masking", ["none", "causal", "padding", "padded_rows"])
def test_linen_outputs_and_gradients(masking):
    rng = np.random.default_rng(1)
    x = uniform(rng, (2, 9, 24))
    mask = None
    if masking == "causal":
        mask = nn.make_causal_mask(jnp.ones((2, 9)))
    elif masking == "padding":
        valid = jnp.asarray(np.arange(9)[None, :] < np.array([[9], [6]]))
        mask = nn.make_attention_mask(valid, valid).astype(bool) | jnp.eye(9, dtype=bool)  # no row sees nothing
    elif masking == "padded_rows":  # the padded queries see no key: flax's mean of the values
        valid = jnp.asarray(np.arange(9)[None, :] < np.array([[9], [6]]))
        mask = nn.make_attention_mask(valid, valid).astype(bool)
    ours, theirs = linen_model(ff.dot_product_attention), linen_model(nn.dot_product_attention)
    params = theirs.init(jax.random.PRNGKey(0), x, mask=mask)

    def loss(model):
        return lambda params, x: jnp.sum(jnp.sin(model.apply(params, x, mask=mask)))

    out = jax.jit(lambda p, x: ours.apply(p, x, mask=mask))(params, x)
    want = theirs.apply(params, x, mask=mask)
    assert rel_error(out, want) < TOL
    g = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(params, x)
    g_want = jax.grad(loss(theirs), argnums=(0, 1))(params, x)
    assert_trees_close(g, g_want)


def test_linen_with_native_keywords_and_batch_dims():
    """fmha's own keywords through functools.partial; [2, 3, T, features]
    inputs (two batch dimensions)."""
    rng = np.random.default_rng(2)
    x = uniform(rng, (2, 3, 7, 16))
    sinks = uniform(rng, (4,))
    model = linen_model(functools.partial(ff.dot_product_attention, sinks=sinks))
    params = model.init(jax.random.PRNGKey(1), x)
    out = jax.jit(model.apply)(params, x)
    # the same attention with the sinks written as a zero value row in flax's softmax
    def with_sink_row(q, k, v, bias=None, mask=None, **kw):
        k = jnp.concatenate([jnp.zeros_like(k[..., :1, :, :]), k], axis=-3)
        v = jnp.concatenate([jnp.zeros_like(v[..., :1, :, :]), v], axis=-3)
        scores_bias = jnp.zeros(q.shape[:-3] + (4, q.shape[-3], k.shape[-3]))
        # the sink's logit replaces scale * q . 0 = 0 in the first column
        scores_bias = scores_bias.at[..., 0].set(jnp.asarray(sinks)[:, None])
        return nn.dot_product_attention(q, k, v, bias=scores_bias, **kw)

    want = linen_model(with_sink_row).apply(params, x)
    assert out.shape == (2, 3, 7, 16)
    assert rel_error(out, want) < TOL


def nnx_model(attention_fn, **kw):
    return nnx.MultiHeadAttention(num_heads=4, in_features=16, qkv_features=32, num_kv_heads=2, decode=False,
                                  attention_fn=attention_fn, rngs=nnx.Rngs(0), **kw)


@pytest.mark.parametrize("is_causal", [False, True])
def test_nnx_outputs_and_gradients(is_causal):
    rng = np.random.default_rng(3)
    x = uniform(rng, (2, 10, 16))
    ours, theirs = nnx_model(ff.dot_product_attention), nnx_model(nnx.dot_product_attention)
    nnx.update(ours, nnx.state(theirs))  # the same parameters

    def loss(model, x):
        return jnp.sum(jnp.sin(model(x, is_causal=is_causal)))

    out = nnx.jit(lambda m, x: m(x, is_causal=is_causal))(ours, x)
    assert rel_error(out, theirs(x, is_causal=is_causal)) < TOL
    g = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(ours, x)
    g_want = nnx.grad(loss, argnums=(0, 1))(theirs, x)
    assert_trees_close(nnx.state(g[0]), nnx.state(g_want[0]))
    assert rel_error(g[1], g_want[1]) < TOL


def test_linen_dropout_is_fmhas_draw():
    """With dropout the model matches flax's weights times the C library's
    draw for the seed of the dropout_rng flax passes (outputs and gradients)."""
    from test_numpy_api import dropout_factors

    from test_jax_native import seed_of

    rng = np.random.default_rng(6)
    x = uniform(rng, (2, 6, 16))
    rate = 0.25

    def dropped_weights_attention(q, k, v, bias=None, mask=None, dropout_rng=None, dropout_rate=0.0,
                                  deterministic=False, **kw):
        w = nn.dot_product_attention_weights(q, k, bias, mask, deterministic=True)
        z = dropout_factors(w.shape, rate, seed_of(dropout_rng), 0)
        return jnp.einsum("...hqk,...khd->...qhd", w * z, v)

    def model(fn):
        return nn.MultiHeadDotProductAttention(num_heads=4, dropout_rate=rate, attention_fn=fn)

    params = model(nn.dot_product_attention).init(jax.random.PRNGKey(0), x, deterministic=True)
    rngs = {"dropout": jax.random.PRNGKey(7)}

    def loss(fn):
        return lambda params: jnp.sum(jnp.sin(model(fn).apply(params, x, deterministic=False, rngs=rngs)))

    assert rel_error(loss(ff.dot_product_attention)(params), loss(dropped_weights_attention)(params)) < TOL
    assert_trees_close(jax.grad(loss(ff.dot_product_attention))(params),
                       jax.grad(loss(dropped_weights_attention))(params))
    off = model(ff.dot_product_attention).apply(params, x, deterministic=True)
    on = model(ff.dot_product_attention).apply(params, x, deterministic=False, rngs=rngs)
    assert not np.allclose(off, on)


def test_nnx_dropout_and_sow_weights_error():
    rng = np.random.default_rng(4)
    x = uniform(rng, (1, 5, 16))
    model = nnx_model(ff.dot_product_attention, dropout_rate=0.1)
    out = model(x, deterministic=False, rngs=nnx.Rngs(dropout=1))
    assert out.shape == (1, 5, 16) and not np.allclose(out, model(x, deterministic=True))
    with pytest.raises(ValueError, match="needs dropout_rng"):
        ff.dot_product_attention(x[:, :, None], x[:, :, None], x[:, :, None], dropout_rate=0.1)
    linen = nn.MultiHeadDotProductAttention(num_heads=4, attention_fn=ff.dot_product_attention)
    params = linen.init(jax.random.PRNGKey(0), x)
    with pytest.raises(NotImplementedError, match="sow_weights"):
        linen.apply(params, x, sow_weights=True, mutable=["intermediates"])


@pytest.mark.parametrize("fmha_precision", ["fast", "accurate"])
def test_linen_bfloat16(fmha_precision):
    """dtype=bfloat16 modules run fmha in bf16; fmha_precision reaches fmha.jax."""
    rng = np.random.default_rng(5)
    x = uniform(rng, (2, 16, 32))
    fn = functools.partial(ff.dot_product_attention, fmha_precision=fmha_precision)
    ours = nn.MultiHeadDotProductAttention(num_heads=4, dtype=jnp.bfloat16, attention_fn=fn)
    params = ours.init(jax.random.PRNGKey(0), x)
    out = jax.jit(ours.apply)(params, x)
    assert out.dtype == jnp.bfloat16
    want = nn.MultiHeadDotProductAttention(num_heads=4).apply(params, x)  # float32 flax
    assert rel_error(np.asarray(out, np.float32), want) < 3e-2
    with pytest.raises(ValueError, match="precision"):
        ff.dot_product_attention(x[:, :, None], x[:, :, None], x[:, :, None], fmha_precision="exact")


def test_flax_keywords_direct_and_in_modules():
    """flax's own keywords called directly: force_fp32_for_softmax changes
    nothing (fmha's softmax is float32), nnx's promote_dtype casts as nnx
    does (bf16 q against float32 k and v), custom einsum hooks are a clear
    error, also from a linen module configured with them (flax passes
    them only to an attention_fn that names them)."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(uniform(rng, (2, 7, 4, 8))) for _ in range(3))
    want = nn.dot_product_attention(q, k, v)
    for fp32 in (False, True):
        got = ff.dot_product_attention(q, k, v, force_fp32_for_softmax=fp32)
        assert rel_error(np.asarray(got), np.asarray(want)) < TOL
    qb = q.astype(jnp.bfloat16)
    got = ff.dot_product_attention(qb, k, v, promote_dtype=flax.nnx.nn.dtypes.promote_dtype)
    want = nnx.dot_product_attention(qb, k, v)
    assert got.dtype == want.dtype == jnp.float32
    assert rel_error(np.asarray(got), np.asarray(want)) < TOL
    for hook in ("einsum_dot_general", "qk_attn_weights_einsum", "attn_weights_value_einsum"):
        with pytest.raises(NotImplementedError, match=hook):
            ff.dot_product_attention(q, k, v, **{hook: jnp.einsum})
    model = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=32, attention_fn=ff.dot_product_attention,
                                            qk_attn_weights_einsum_cls=lambda: jnp.einsum,
                                            attn_weights_value_einsum_cls=lambda: jnp.einsum)
    x = jnp.asarray(uniform(rng, (2, 7, 16)))
    with pytest.raises(NotImplementedError, match="qk_attn_weights_einsum"):
        model.init(jax.random.PRNGKey(0), x)
