"""test_jax_native: fmha.jax.dot_product_attention's own keywords (segment
ids, ALiBi, relative-position table, softcap, bottom-right alignment,
windows, lengths, sinks, precision) against the float64 reference of
conftest: outputs and the gradients of query, key, value and every float
parameter under jit, grad and vmap; errors at trace and run time."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fmha.jax as fj  # noqa: E402
from fmha._lib import FmhaError  # noqa: E402

from conftest import jax_reference as reference  # noqa: E402  (fmha.jax follows jax.nn where no key is seen)
from conftest import rel_error, require, uniform  # noqa: E402

TOL = 2e-5
B, T, S, N, K, H = 2, 11, 13, 4, 2, 16   # tails, GQA, T != S
GRAD_NAMES = {"alibi_slopes": "d_alibi", "rel_table": "d_rel_table", "sinks": "d_sinks"}


def case(name, rng, t=T, s=S):
    """(keywords of fmha.jax, keywords of the reference, requirement) for one
    native keyword; float parameters are the differentiable ones."""
    q_len, kv_len = np.array([t, t - 4], np.int32), np.array([s - 3, s], np.int32)
    if name == "segment_ids":
        q_ids = np.sort(rng.integers(0, 3, (B, t)), axis=1).astype(np.int32)
        kv_ids = np.sort(rng.integers(0, 3, (B, s)), axis=1).astype(np.int32)
        return dict(segment_ids=(q_ids, kv_ids)), dict(segment_ids=(q_ids, kv_ids)), "segments"
    if name == "alibi_slopes":
        a = rng.uniform(0.05, 0.5, N).astype(np.float32)
        return dict(alibi_slopes=a, is_causal=True), dict(alibi=a, is_causal=True), "alibi"
    if name == "rel_table":
        r = uniform(rng, (N, 8))
        kw = dict(rel_max_distance=6, rel_bidirectional=False)
        return dict(rel_table=r, **kw), dict(rel_table=r, **kw), "rel_table"
    if name == "softcap":
        return dict(softcap=0.7), dict(softcap=0.7), "softcap"
    if name == "causal_alignment":
        kw = dict(is_causal=True, query_seq_lengths=q_len, key_value_seq_lengths=kv_len)
        return (dict(causal_alignment="bottom_right", **kw),
                dict(causal_alignment="bottom_right", is_causal=True, q_lengths=q_len, kv_lengths=kv_len),
                "bottom_right")
    if name == "local_window_size":
        return dict(local_window_size=(3, 2)), dict(window=(3, 2)), "window"
    if name == "seq_lengths":
        return (dict(query_seq_lengths=q_len, key_value_seq_lengths=kv_len),
                dict(q_lengths=q_len, kv_lengths=kv_len), "kv_lengths")
    if name == "sinks":
        z = uniform(rng, (N,)) * 2
        kw = dict(is_causal=True, causal_alignment="bottom_right", query_seq_lengths=q_len)
        return (dict(sinks=z, **kw), dict(sinks=z, is_causal=True, causal_alignment="bottom_right",
                                          q_lengths=q_len), None)
    raise AssertionError(name)


KEYWORDS = ["segment_ids", "alibi_slopes", "rel_table", "softcap", "causal_alignment", "local_window_size",
            "seq_lengths", "sinks"]


def split(kw):
    """kw's float parameters (differentiated) and the rest."""
    params = {n: x for n, x in kw.items() if n in GRAD_NAMES}
    return params, {n: x for n, x in kw.items() if n not in GRAD_NAMES}


@pytest.mark.parametrize("name", KEYWORDS)
def test_keyword_jit_and_grad(name):
    rng = np.random.default_rng(len(name))
    kw, ref_kw, feature = case(name, rng)
    if feature:
        require(feature)
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    d_o = uniform(rng, (B, T, N, H))
    params, rest = split(kw)

    def run(q, k, v, params):
        out, vjp = jax.vjp(lambda q, k, v, p: fj.dot_product_attention(q, k, v, **p, **rest), q, k, v, params)
        return out, vjp(d_o)

    out, (dq, dk, dv, d_params) = jax.jit(run)(q, k, v, params)
    ref = reference(q, k, v, d_out=d_o, **ref_kw)
    assert rel_error(out, ref["o"]) < TOL
    for got, want in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        assert rel_error(got, ref[want]) < TOL, want
    for n, g in d_params.items():
        assert g.shape == np.shape(params[n]) and g.dtype == jnp.float32
        assert rel_error(g, ref[GRAD_NAMES[n]]) < TOL, n


def test_parameter_gradients_together_and_in_their_dtype():
    """ALiBi, table, sinks and softcap at once; a bf16 sink gets a bf16 gradient."""
    require("alibi", "rel_table", "softcap")
    rng = np.random.default_rng(3)
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    d_o = uniform(rng, (B, T, N, H))
    a, r, z = rng.uniform(0.05, 0.5, N).astype(np.float32), uniform(rng, (N, 6)), uniform(rng, (N,))

    def loss(q, a, r, z):
        return jnp.sum(fj.dot_product_attention(q, k, v, alibi_slopes=a, rel_table=r, sinks=z, softcap=2.0,
                                                is_causal=True) * d_o)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, a, r, z)
    ref = reference(q, k, v, alibi=a, rel_table=r, sinks=z, softcap=2.0, is_causal=True, d_out=d_o)
    for g, n in zip(grads, ("dq", "d_alibi", "d_rel_table", "d_sinks")):
        assert rel_error(g, ref[n]) < TOL, n
    z16 = jnp.asarray(z, jnp.bfloat16)
    g16 = jax.grad(lambda z: loss(q, a, r, z))(z16)
    assert g16.dtype == jnp.bfloat16
    ref16 = reference(q, k, v, alibi=a, rel_table=r, sinks=np.asarray(z16, np.float32), softcap=2.0,
                      is_causal=True, d_out=d_o)
    assert rel_error(np.asarray(g16, np.float32), ref16["d_sinks"]) < 1e-2


def test_only_the_differentiated_parameters_get_gradients():
    rng = np.random.default_rng(4)
    q, k, v = uniform(rng, (1, 4, 2, 8)), uniform(rng, (1, 4, 2, 8)), uniform(rng, (1, 4, 2, 8))
    z, a = uniform(rng, (2,)), np.full(2, 0.1, np.float32)

    def jaxpr(argnums):
        f = lambda q, z, a: fj.dot_product_attention(q, k, v, sinks=z, alibi_slopes=a).sum()  # noqa: E731
        return str(jax.make_jaxpr(jax.grad(f, argnums=argnums))(q, z, a))

    assert "grads', np.int64(0)" in jaxpr(0) or "grads=0" in jaxpr(0)
    assert "grads', np.int64(8)" in jaxpr(1) or "grads=8" in jaxpr(1)
    assert "grads', np.int64(10)" in jaxpr((1, 2)) or "grads=10" in jaxpr((1, 2))


@pytest.mark.parametrize("name", KEYWORDS)
def test_keyword_vmap(name):
    """vmap over a leading axis of q (and of the float parameters): each
    slice is its own reference call; per-example gradients under vmap(grad)."""
    rng = np.random.default_rng(100 + len(name))
    kw, ref_kw, feature = case(name, rng)
    if feature:
        require(feature)
    V = 3
    qs = uniform(rng, (V, B, T, N, H))
    k, v = uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    params, rest = split(kw)
    stacked = {n: np.stack([case(name, np.random.default_rng(i))[0][n] for i in range(V)]) for n in params}

    def loss(q, p):
        return jnp.sum(fj.dot_product_attention(q, k, v, **p, **rest) ** 2)

    outs = jax.jit(jax.vmap(lambda q, p: fj.dot_product_attention(q, k, v, **p, **rest)))(qs, stacked)
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(qs, stacked)
    for i in range(V):
        slice_kw = {n: x[i] for n, x in stacked.items()}
        slice_ref_kw = case(name, np.random.default_rng(i))[1] if params else ref_kw
        ref = reference(qs[i], k, v, d_out=2 * np.asarray(outs[i], np.float64), **slice_ref_kw)
        assert rel_error(outs[i], ref["o"]) < TOL
        assert rel_error(grads[0][i], ref["dq"]) < TOL
        for n in slice_kw:
            assert rel_error(grads[1][n][i], ref[GRAD_NAMES[n]]) < TOL, n


def test_vmap_with_shared_parameters():
    """Unbatched sinks and slopes under vmap: their gradient sums the slices."""
    require("alibi")
    rng = np.random.default_rng(7)
    V = 3
    qs = uniform(rng, (V, B, T, N, H))
    k, v = uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    z, a = uniform(rng, (N,)), rng.uniform(0.05, 0.5, N).astype(np.float32)
    d_o = uniform(rng, (V, B, T, N, H))

    def loss(z, a):
        out = jax.vmap(lambda q: fj.dot_product_attention(q, k, v, sinks=z, alibi_slopes=a))(qs)
        return jnp.sum(out * d_o)

    dz, da = jax.jit(jax.grad(loss, argnums=(0, 1)))(z, a)
    refs = [reference(qs[i], k, v, sinks=z, alibi=a, d_out=d_o[i]) for i in range(V)]
    assert rel_error(dz, sum(r["d_sinks"] for r in refs)) < TOL
    assert rel_error(da, sum(r["d_alibi"] for r in refs)) < TOL


def test_vmap_over_integer_inputs():
    """Batched segment ids and lengths (one library call per slice) with shared q, k, v."""
    require("segments", "kv_lengths")
    rng = np.random.default_rng(11)
    V = 3
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    q_ids = np.sort(rng.integers(0, 3, (V, B, T)), axis=2).astype(np.int32)
    kv_ids = np.sort(rng.integers(0, 3, (V, B, S)), axis=2).astype(np.int32)
    kv_len = rng.integers(1, S + 1, (V, B)).astype(np.int32)

    def loss(q, qi, ki, kl):
        return jnp.sum(fj.dot_product_attention(q, k, v, segment_ids=(qi, ki), key_value_seq_lengths=kl) ** 2)

    dq = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0)))(q, q_ids, kv_ids, kv_len)
    for i in range(V):
        kw = dict(segment_ids=(q_ids[i], kv_ids[i]), kv_lengths=kv_len[i])
        o = reference(q, k, v, **kw)["o"]
        assert rel_error(dq[i], reference(q, k, v, d_out=2 * o, **kw)["dq"]) < TOL


def test_one_segment_array_and_integer_inputs_without_gradient():
    require("segments")
    rng = np.random.default_rng(8)
    q, k, v = (uniform(rng, (B, 9, N, H)) for _ in range(3))
    ids = np.repeat(np.array([[0, 0, 0, 1, 1, 1, 1, 2, 2]]), B, axis=0).astype(np.int64)
    out = jax.jit(lambda q, ids: fj.dot_product_attention(q, k, v, segment_ids=ids))(q, ids)
    assert rel_error(out, reference(q, k, v, segment_ids=ids)["o"]) < TOL
    g = jax.grad(lambda q, ids: fj.dot_product_attention(q, k, v, segment_ids=ids).sum())(q, ids)
    assert g.shape == q.shape


def test_precision_bf16():
    require("bfloat16")
    rng = np.random.default_rng(9)
    q, k, v = (jnp.asarray(uniform(rng, (B, 32, N, H) if i == 0 else (B, 32, K, H)), jnp.bfloat16)
               for i in range(3))
    ref = reference(*(np.asarray(x, np.float32) for x in (q, k, v)), is_causal=True)["o"]
    errors = {}
    for precision in ("fast", "accurate"):
        out = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True,
                                                               precision=precision))(q, k, v)
        errors[precision] = rel_error(np.asarray(out, np.float32), ref)
        assert errors[precision] < 1e-2, precision
    assert errors["accurate"] <= errors["fast"] * 1.01


def test_errors():
    rng = np.random.default_rng(10)
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    bad = [dict(sinks=np.zeros(N + 1, np.float32)),
           dict(sinks=np.zeros(N, np.int32)),
           dict(alibi_slopes=np.zeros((N, 1), np.float32)),
           dict(rel_table=np.zeros((N + 1, 4), np.float32)),
           dict(segment_ids=np.zeros((B, T), np.int32)),          # one array needs T == S
           dict(segment_ids=(np.zeros((B, T), np.float32), np.zeros((B, S), np.int32))),
           dict(softcap=-1.0),
           dict(precision="exact"),
           dict(is_causal=True, causal_alignment="middle")]
    for kw in bad:
        with pytest.raises(ValueError):
            fj.dot_product_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="none of fmha's own keywords"):
        fj.dot_product_attention(q, k, v, sinks=np.zeros(N, np.float32), implementation="xla")
    # refused by the C library while tracing
    with pytest.raises(FmhaError, match="FMHA_ERR_BAD_MASK"):
        fj.dot_product_attention(q, k, v, rel_table=np.zeros((N, 4), np.float32), rel_max_distance=0)
    # a non-finite sink is known only when the call runs
    with pytest.raises(Exception, match="FMHA_ERR_BAD_MASK"):
        np.asarray(jax.jit(lambda z: fj.dot_product_attention(q, k, v, sinks=z))(
            np.array([0, np.inf, 0, 0], np.float32)))


def test_native_operands_keep_plans_cached():
    """A jitted step with slopes, table and sinks as arguments plans once."""
    rng = np.random.default_rng(12)
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    a, r, z = np.full(N, 0.1, np.float32), uniform(rng, (N, 8)), uniform(rng, (N,))
    step = jax.jit(jax.grad(lambda q, a, r, z: fj.dot_product_attention(
        q, k, v, alibi_slopes=a, rel_table=r, sinks=z).sum(), argnums=(0, 1, 2, 3)))
    args = [jnp.asarray(x) for x in (q, a, r, z)]
    jax.block_until_ready(step(*args))
    fj.plan_cache_clear()
    for _ in range(4):
        jax.block_until_ready(step(*args))
    info = fj.plan_cache_info()
    assert info["misses"] <= 2 and info["hits"] >= 6  # forward and backward plans, then hits


def seed_of(key):
    """The 64-bit dropout seed fmha.jax derives from a PRNG key."""
    b = np.asarray(jax.random.bits(key, (2,), jnp.uint32)).astype(np.uint64)
    return int(b[0]) << 32 | int(b[1])


@pytest.mark.parametrize("p", [0.2, 0.7])
def test_dropout_matches_the_reference_with_the_same_draw(p):
    from test_numpy_api import dropout_factors

    rng = np.random.default_rng(int(p * 10))
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    d_o = uniform(rng, (B, T, N, H))
    key = jax.random.PRNGKey(42)
    z = uniform(rng, (N,))

    def run(q, k, v, z, key):
        f = lambda q, k, v, z: fj.dot_product_attention(q, k, v, is_causal=True, sinks=z, dropout_p=p,  # noqa
                                                        dropout_rng=key)
        out, vjp = jax.vjp(f, q, k, v, z)
        return out, vjp(d_o)

    out, grads = jax.jit(run)(q, k, v, z, key)
    drop = dropout_factors((B, N, T, S), p, seed_of(key), 0)
    ref = reference(q, k, v, is_causal=True, sinks=z, dropout=drop, d_out=d_o)
    assert rel_error(out, ref["o"]) < TOL
    for g, n in zip(grads, ("dq", "dk", "dv", "d_sinks")):
        assert rel_error(g, ref[n]) < TOL, n
    # the same key, the same bits; another key, another draw
    again, _ = jax.jit(run)(q, k, v, z, key)
    assert np.array_equal(out, again)
    other, _ = jax.jit(run)(q, k, v, z, jax.random.PRNGKey(43))
    assert not np.array_equal(out, other)


def test_dropout_errors():
    rng = np.random.default_rng(13)
    q = uniform(rng, (1, 4, 2, 8))
    with pytest.raises(ValueError, match="needs dropout_rng"):
        fj.dot_product_attention(q, q, q, dropout_p=0.1)
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="dropout_p must be in"):
            fj.dot_product_attention(q, q, q, dropout_p=bad, dropout_rng=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="none of fmha's own keywords"):
        fj.dot_product_attention(q, q, q, dropout_p=0.1, implementation="xla")


def test_dropout_under_vmap():
    """Mapped keys draw independently; a shared key draws the same weights per slice."""
    rng = np.random.default_rng(14)
    q = uniform(rng, (B, T, N, H))
    k, v = uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    attend = lambda q, key: fj.dot_product_attention(q, k, v, dropout_p=0.5, dropout_rng=key)  # noqa: E731
    mapped = jax.jit(jax.vmap(attend, in_axes=(None, 0)))(q, keys)
    for i in range(2):
        assert np.array_equal(mapped[i], attend(q, keys[i]))
    assert not np.array_equal(mapped[0], mapped[1])
    shared = jax.jit(jax.vmap(attend, in_axes=(0, None)))(np.stack([q, q]), keys[0])
    assert np.array_equal(shared[0], shared[1]) and np.array_equal(shared[0], mapped[0])
