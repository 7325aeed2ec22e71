"""Paged KV caches (block_table=) and a cache dtype of its own (bf16 or f16
key and value beside float32 query) through NumPy fmha.attention, against
the float64 reference on the rounded cache values. Bad tables and dtypes
are clear errors."""
import numpy as np
import pytest

import fmha
from fmha import _lib
from conftest import paged, reference, rel_error, uniform

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 caches need ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("kv_dtype", [np.float32, BF16, np.float16], ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("page", [1, 3, 16, 64])
@pytest.mark.parametrize("T,N,K", [(1, 8, 1), (4, 32, 8), (16, 4, 2)])
def test_paged_matches_reference(kv_dtype, page, T, N, K):
    rng = np.random.default_rng(page * 100 + T)
    B, S, H = 3, 200, 32
    q = uniform(rng, (B, T, N, H))
    k = uniform(rng, (B, S, K, H)).astype(kv_dtype)
    v = uniform(rng, (B, S, K, H)).astype(kv_dtype)
    lengths = np.array([S, rng.integers(1, S), 0], np.int32)
    sinks = uniform(rng, (N,)) if T == 4 else None
    kp, vp, table = paged(rng, k, v, lengths, page)
    out, lse = fmha.attention(q, kp, vp, key_value_seq_lengths=lengths, block_table=table, is_causal=True,
                              causal_alignment="bottom_right", sinks=sinks, return_lse=True)
    assert out.dtype == np.float32
    # the reference sees the cache padded to max_pages * page keys
    S_all = table.shape[1] * page
    kw, vw = np.zeros((B, S_all, K, H)), np.zeros((B, S_all, K, H))
    kw[:, :S], vw[:, :S] = k.astype(np.float64), v.astype(np.float64)
    ref = reference(q, kw, vw, is_causal=True, causal_alignment="bottom_right", kv_lengths=lengths,
                    sinks=sinks)
    assert rel_error(out, ref["o"]) < 2e-5
    seen = np.isfinite(ref["lse"])
    assert np.array_equal(seen, np.isfinite(lse))
    assert np.max(np.abs(lse[seen] - ref["lse"][seen])) < 1e-4


@pytest.mark.parametrize("T", [1, 5])
def test_paged_sliding_window_without_causal(T):
    """flash_attn_with_kvcache(window_size=(16, -1), causal=False): the
    window is measured bottom-right (i + kv_len - q_len against j) though
    no causal mask is asked for; T > 1 queries see the keys past them."""
    rng = np.random.default_rng(17 + T)
    B, S, N, K, H = 3, 120, 4, 2, 32
    q = uniform(rng, (B, T, N, H))
    k, v = uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))
    lengths = np.array([S, 57, 9], np.int32)
    kp, vp, table = paged(rng, k, v, lengths, 16)
    out = fmha.attention(q, kp, vp, key_value_seq_lengths=lengths, block_table=table, local_window_size=(16, None),
                         causal_alignment="bottom_right")
    S_all = table.shape[1] * 16
    kw, vw = np.zeros((B, S_all, K, H)), np.zeros((B, S_all, K, H))
    kw[:, :S], vw[:, :S] = k, v
    ref = reference(q, kw, vw, window=(16, None), causal_alignment="bottom_right", kv_lengths=lengths)
    assert rel_error(out, ref["o"]) < 2e-5


@pytest.mark.parametrize("kv_dtype", [BF16, np.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("T", [1, 70])
def test_cache_dtype_contiguous(kv_dtype, T):
    rng = np.random.default_rng(T)
    B, S, N, K, H = 2, 150, 4, 2, 40
    q = uniform(rng, (B, T, N, H))
    k = uniform(rng, (B, S, K, H)).astype(kv_dtype)
    v = uniform(rng, (B, S, K, H)).astype(kv_dtype)
    lengths = np.array([S, 90], np.int32)
    out = fmha.attention(q, k, v, key_value_seq_lengths=lengths, is_causal=True, causal_alignment="bottom_right")
    ref = reference(q, k.astype(np.float64), v.astype(np.float64), is_causal=True,
                    causal_alignment="bottom_right", kv_lengths=lengths)
    assert out.dtype == np.float32
    assert rel_error(out, ref["o"]) < 2e-5
    # the float32 call on the widened values gives the same bits
    same = fmha.attention(q, k.astype(np.float32), v.astype(np.float32), key_value_seq_lengths=lengths,
                          is_causal=True, causal_alignment="bottom_right")
    assert np.array_equal(out, same)


def test_errors():
    rng = np.random.default_rng(0)
    B, N, K, H, page = 2, 4, 2, 16, 4
    q = uniform(rng, (B, 1, N, H))
    pool = uniform(rng, (6, page, K, H))
    table = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    lengths = np.array([12, 5], np.int32)
    fmha.attention(q, pool, pool, key_value_seq_lengths=lengths, block_table=table)
    with pytest.raises(ValueError, match="key_value_seq_lengths"):
        fmha.attention(q, pool, pool, block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        fmha.attention(q, pool, pool, key_value_seq_lengths=lengths, block_table=table[:1])
    bad = table.copy()
    bad[1, 1] = 6  # a page past the pool, inside sequence 1's length
    with pytest.raises(_lib.FmhaError, match="block table"):
        fmha.attention(q, pool, pool, key_value_seq_lengths=lengths, block_table=bad)
    bad[1, 1], bad[1, 2] = 4, 99  # past sequence 1's pages: never read
    fmha.attention(q, pool, pool, key_value_seq_lengths=lengths, block_table=bad)
    with pytest.raises(ValueError):  # lengths past max_pages * page_size
        fmha.attention(q, pool, pool, key_value_seq_lengths=np.array([13, 5], np.int32), block_table=table)
    with pytest.raises(TypeError, match="dtype"):  # a cache dtype of its own needs float32 query
        fmha.attention(q.astype(np.float16), pool.astype(BF16), pool.astype(BF16))
    with pytest.raises(TypeError, match="dtype"):  # key and value share theirs
        fmha.attention(q, pool.astype(BF16), pool.astype(np.float16))
    with pytest.raises(_lib.FmhaError) as e:  # the backward of a mixed problem
        k = pool.reshape(2, 12, K, H).astype(BF16)
        fmha.attention_backward(q, k, k, q, np.zeros((B, N, 1), np.float32), q)
    assert e.value.unsupported


@pytest.mark.parametrize("T, causal", [(1, True), (4, True), (3, False)])
def test_paged_softcap_and_alibi(T, causal):
    """Softcap and ALiBi on a paged cache (Gemma 2's softcap, BLOOM's
    slopes; flash_attn_with_kvcache takes both), bottom-right aligned."""
    rng = np.random.default_rng(40 + T)
    B, S, N, K, H = 2, 90, 4, 2, 16
    q = uniform(rng, (B, T, N, H)) * 3
    k, v = uniform(rng, (B, S, K, H)) * 3, uniform(rng, (B, S, K, H))
    lengths = np.array([S, 41], np.int32)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    kp, vp, table = paged(rng, k, v, lengths, 7)
    out = fmha.attention(q, kp, vp, key_value_seq_lengths=lengths, block_table=table, is_causal=causal,
                         causal_alignment="bottom_right", softcap=2.0, alibi_slopes=slopes)
    S_all = table.shape[1] * 7
    kw, vw = np.zeros((B, S_all, K, H)), np.zeros((B, S_all, K, H))
    kw[:, :S], vw[:, :S] = k, v
    ref = reference(q, kw, vw, is_causal=causal, causal_alignment="bottom_right", kv_lengths=lengths, softcap=2.0,
                    alibi=slopes)
    assert rel_error(out, ref["o"]) < 2e-5
