"""test_jax_paged: paged KV caches (block_table=) and a KV cache dtype of its
own (bfloat16 / float16 key and value beside a float32 query) through
fmha.jax.dot_product_attention, under jit and vmap, against the float64
reference of conftest on the caches gathered back from the shuffled pages;
the prefill-then-decode identity; the handler's plan cache; the errors
(at trace time, at run time, and for differentiation, which these calls
do not have).

Tolerances: float32 outputs against float64, relative (Frobenius) error
below 2e-5 and lse within 1e-4 (conftest.check_paged); token-by-token
decoding against one causal forward of the same binding, relative error
below 1e-5."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed")
import jax.numpy as jnp  # noqa: E402

import fmha.jax as fj  # noqa: E402
from fmha._lib import FmhaError  # noqa: E402

from conftest import check_paged, paged_case, prefill_then_decode, reference, rel_error, uniform  # noqa: E402

BF16 = jnp.bfloat16
KV_DTYPES = [np.float32, BF16, np.float16]
KV_IDS = ["f32", "bf16", "f16"]


@jax.jit
def _paged_jit(q, k, v, table, lengths, sinks):
    return fj.dot_product_attention(q, k, v, block_table=table, key_value_seq_lengths=lengths, sinks=sinks,
                                    is_causal=True, causal_alignment="bottom_right", return_residual=True)


def run(c, **kw):
    """out [B, T, N, H] and lse [B, N, T] of a paged_case through the jitted call."""
    out, residual = _paged_jit(c["q"], c["k"], c["v"], c["table"], c["lengths"], c["sinks"], **kw)
    return np.asarray(out), np.transpose(np.asarray(residual), (0, 2, 1))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=KV_IDS)
@pytest.mark.parametrize("page", [1, 16, 256])
@pytest.mark.parametrize("T,N,K", [(1, 8, 1), (5, 4, 2), (16, 8, 1)])
def test_paged_matches_reference(kv_dtype, page, T, N, K):
    c = paged_case(page + T, T, N, K, page, kv_dtype, sinks=T == 5)
    out, lse = run(c)
    assert out.dtype == np.float32
    check_paged(out, lse, c["ref"])


def test_paged_not_causal_gqa_value_dim():
    c = paged_case(3, 4, 8, 2, 16, sinks=True, is_causal=False)
    out = fj.dot_product_attention(c["q"], c["k"], c["v"], block_table=c["table"], key_value_seq_lengths=c["lengths"],
                                   sinks=c["sinks"])
    check_paged(np.asarray(out), None, c["ref"])


def test_paged_under_vmap():
    """vmap over the query, the table and the lengths (the pools shared):
    every slice reads its own pages."""
    cases = [paged_case(40 + i, 3, 4, 2, 8, BF16) for i in range(2)]
    # one pair of pools for both slices: the second case's pages follow the first's
    P = cases[0]["k"].shape[0]
    k = np.concatenate([c["k"] for c in cases])
    v = np.concatenate([c["v"] for c in cases])
    tables = np.stack([cases[0]["table"], np.where(cases[1]["table"] >= 0, cases[1]["table"] + P, -1)])
    f = jax.vmap(lambda q, t, n: fj.dot_product_attention(q, k, v, block_table=t, key_value_seq_lengths=n,
                                                          is_causal=True, causal_alignment="bottom_right"))
    out = jax.jit(f)(np.stack([c["q"] for c in cases]), tables, np.stack([c["lengths"] for c in cases]))
    for i, c in enumerate(cases):
        check_paged(np.asarray(out[i]), None, c["ref"])


def test_plan_cache_serves_repeated_paged_calls():
    c = paged_case(7, 1, 4, 2, 16)
    args = [jnp.asarray(c[name]) for name in ("q", "k", "v", "table", "lengths")]
    f = jax.jit(lambda q, k, v, t, n: fj.dot_product_attention(q, k, v, block_table=t, key_value_seq_lengths=n,
                                                                is_causal=True, causal_alignment="bottom_right"))
    first = np.asarray(f(*args))
    before = fj.plan_cache_info()
    for _ in range(3):
        assert np.array_equal(np.asarray(f(*args)), first)
    after = fj.plan_cache_info()
    assert after["hits"] >= before["hits"] + 3
    check_paged(first, None, c["ref"])


@pytest.mark.parametrize("kv_dtype", [BF16, np.float16], ids=["bf16", "f16"])
def test_cache_dtype_contiguous(kv_dtype):
    """A float32 query with a bf16 / f16 cache, not paged: the reference on
    the rounded values, and the same bits as float32 key and value."""
    rng = np.random.default_rng(5)
    B, T, S, N, K, H = 2, 6, 40, 4, 2, 16
    q = uniform(rng, (B, T, N, H))
    k, v = (uniform(rng, (B, S, K, H)).astype(kv_dtype) for _ in range(2))
    lengths = np.array([S, 23], np.int32)
    f = jax.jit(lambda q, k, v, n: fj.dot_product_attention(q, k, v, key_value_seq_lengths=n, is_causal=True,
                                                             causal_alignment="bottom_right"))
    out = np.asarray(f(q, k, v, lengths))
    assert out.dtype == np.float32
    ref = reference(q, np.asarray(k, np.float64), np.asarray(v, np.float64), is_causal=True,
                    causal_alignment="bottom_right", kv_lengths=lengths)
    assert rel_error(out, ref["o"]) < 2e-5
    widened = np.asarray(f(q, np.asarray(k, np.float32), np.asarray(v, np.float32), lengths))
    assert np.array_equal(out, widened)


@pytest.mark.parametrize("kv_dtype,page", [(np.float32, 1), (np.float32, 4), (BF16, 16)], ids=["f32-1", "f32-4",
                                                                                               "bf16-16"])
def test_prefill_then_decode_equals_one_causal_forward(kv_dtype, page):
    def attend(q, k, v, table, kv_lengths, q_lengths):
        return _decode_jit(q, k, v, table, kv_lengths, q_lengths)

    out, q, k, v = prefill_then_decode(attend, np.random.default_rng(page), page=page, kv_dtype=kv_dtype)
    full = np.asarray(fj.dot_product_attention(q, k, v, is_causal=True))
    assert rel_error(out, full) < 1e-5
    assert rel_error(out, reference(q, np.asarray(k, np.float64), np.asarray(v, np.float64), is_causal=True)["o"]) \
        < 2e-5


@jax.jit
def _decode_jit(q, k, v, table, kv_lengths, q_lengths):
    return fj.dot_product_attention(q, k, v, block_table=table, key_value_seq_lengths=kv_lengths,
                                    query_seq_lengths=q_lengths, is_causal=True, causal_alignment="bottom_right")


def test_errors():
    c = paged_case(11, 2, 4, 2, 4)
    q, k, v, table, lengths = (c[name] for name in ("q", "k", "v", "table", "lengths"))
    call = fj.dot_product_attention
    with pytest.raises(ValueError, match="needs key_value_seq_lengths"):
        call(q, k, v, block_table=table)
    with pytest.raises(ValueError, match="block_table shape"):
        call(q, k, v, block_table=table[:1], key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="block_table shape"):
        call(q, k, v, block_table=table[:, :, None], key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="block_table dtype"):
        call(q, k, v, block_table=table.astype(np.float32), key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="4-D query"):
        call(q[0], k, v, block_table=table[:1], key_value_seq_lengths=lengths[:1])
    with pytest.raises(ValueError, match="none of fmha's own keywords"):
        call(q, k, v, block_table=table, key_value_seq_lengths=lengths, implementation="xla")
    # a dense mask is not served with a block table: refused while tracing
    with pytest.raises(FmhaError, match="FMHA_ERR_UNSUPPORTED"):
        call(q, k, v, np.zeros((1, 1, 1, 1), np.float32), block_table=table, key_value_seq_lengths=lengths)
    # a page index past the pools is found when the call runs
    bad = table.copy()
    bad[0, 0] = k.shape[0]
    f = jax.jit(lambda t: call(q, k, v, block_table=t, key_value_seq_lengths=lengths))
    with pytest.raises(Exception, match="FMHA_ERR_BAD_PAGE"):
        np.asarray(f(bad))
    bad[0, 0] = -1
    with pytest.raises(Exception, match="FMHA_ERR_BAD_PAGE"):
        np.asarray(f(bad))
    np.asarray(f(table))  # entries past each sequence's pages (-1 here) are never read
    # key lengths past max_pages * page_size
    with pytest.raises(Exception, match="FMHA_ERR_BAD_MASK"):
        np.asarray(jax.jit(lambda n: call(q, k, v, block_table=table, key_value_seq_lengths=n))(
            np.array([table.shape[1] * k.shape[1] + 1, 1, 1], np.int32)))
    # cache dtypes fmha does not serve
    with pytest.raises(ValueError, match="share a dtype"):
        call(q.astype(np.float16), k.astype(BF16), v.astype(BF16), block_table=table, key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="share a dtype"):
        call(q, k.astype(BF16), v.astype(np.float16), block_table=table, key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="share a dtype"):
        call(q.astype(BF16), k, v, block_table=table, key_value_seq_lengths=lengths)


def test_no_gradient():
    """Paged caches and caches of their own dtype are forward only:
    differentiating them is a clear FmhaError, whichever input is asked."""
    c = paged_case(12, 2, 4, 2, 4)
    q, k, v, table, lengths = (c[name] for name in ("q", "k", "v", "table", "lengths"))

    def loss(q, k, v):
        return fj.dot_product_attention(q, k, v, block_table=table, key_value_seq_lengths=lengths).sum()

    for argnums in (0, 1, (1, 2)):
        with pytest.raises(FmhaError, match="block_table.*forward only") as e:
            jax.grad(loss, argnums=argnums)(q, k, v)
        assert e.value.unsupported
    kb = np.zeros((3, 8, 2, 16), BF16)
    with pytest.raises(FmhaError, match="cache dtype.*forward only"):
        jax.grad(lambda q: fj.dot_product_attention(q, kb, kb).sum())(np.zeros((3, 2, 4, 16), np.float32))
    # no cotangent reaches the call: nothing to refuse
    g = jax.grad(lambda q: (q * jax.lax.stop_gradient(
        fj.dot_product_attention(q, k, v, block_table=table, key_value_seq_lengths=lengths))).sum())(q)
    assert np.isfinite(np.asarray(g)).all()
    g = jax.grad(lambda q: (q * fj.dot_product_attention(jax.lax.stop_gradient(q), k, v, block_table=table,
                                                         key_value_seq_lengths=lengths)).sum())(q)
    assert np.isfinite(np.asarray(g)).all()
