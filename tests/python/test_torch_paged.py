"""test_torch_paged: paged KV caches (block_table=) and a KV cache dtype of
its own (bfloat16 / float16 key and value beside a float32 query) through
fmha.torch.scaled_dot_product_attention and the fmha::attention op, against
the float64 reference of conftest on the caches gathered back from the
shuffled pages; pools [num_pages, Hkv, page_size, E] as views of
[num_pages, page_size, Hkv, E] storage and as contiguous tensors; the
prefill-then-decode identity; opcheck and torch.compile of the op with a
table; the errors, and the backward these calls do not have.

Tolerances: float32 outputs against float64, relative (Frobenius) error
below 2e-5 and lse within 1e-4 (conftest.check_paged); token-by-token
decoding against one causal forward of the same binding, relative error
below 1e-5. Skipped when PyTorch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fmha.torch as FT  # noqa: E402
from fmha import _lib  # noqa: E402
from fmha._lib import FmhaError  # noqa: E402

from conftest import check_paged, paged_case, prefill_then_decode, reference, rel_error, uniform  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 caches need ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
KV_DTYPES = [np.float32, BF16, np.float16]
KV_IDS = ["f32", "bf16", "f16"]
TORCH_DTYPES = {np.dtype(np.float32): torch.float32, BF16: torch.bfloat16, np.dtype(np.float16): torch.float16}


def tensor(x):
    """A NumPy array (bf16 included) as a torch tensor of its dtype."""
    x = np.asarray(x)
    if x.dtype == BF16:
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)  # exact
    return torch.from_numpy(x)


def heads_first(x):
    """[B, T, N, H] (or a pool [P, page, K, H]) as SDPA's [B, N, T, H] view."""
    return tensor(x).transpose(1, 2)


def tokens_first(t):
    """[B, N, T, H] tensor -> [B, T, N, H] float64 array."""
    return t.detach().double().transpose(1, 2).numpy()


def sdpa_paged(c, contiguous_pools=False, **kw):
    k, v = heads_first(c["k"]), heads_first(c["v"])
    if contiguous_pools:
        k, v = k.contiguous(), v.contiguous()
    sinks = None if c["sinks"] is None else torch.from_numpy(c["sinks"])
    return FT.scaled_dot_product_attention(heads_first(c["q"]), k, v, enable_gqa=True, block_table=c["table"],
                                           key_value_seq_lengths=c["lengths"], sinks=sinks, **kw)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=KV_IDS)
@pytest.mark.parametrize("page", [1, 16, 256])
@pytest.mark.parametrize("T,N,K", [(1, 8, 1), (5, 4, 2), (16, 8, 1)])
def test_paged_matches_reference(kv_dtype, page, T, N, K):
    c = paged_case(page + T, T, N, K, page, kv_dtype, sinks=T == 5)
    out = sdpa_paged(c, is_causal=True, causal_alignment="bottom_right")
    assert out.dtype == torch.float32 and out.shape == (3, N, T, 16)
    check_paged(tokens_first(out), None, c["ref"])


@pytest.mark.parametrize("contiguous_pools", [False, True], ids=["page-major-view", "heads-first"])
def test_pool_layouts_and_lse(contiguous_pools):
    """Pools as views of [P, page, K, H] storage and as contiguous
    [P, K, page, H] tensors; the op's lse against the reference's."""
    c = paged_case(21, 4, 8, 2, 16, BF16, sinks=True)
    k, v = heads_first(c["k"]), heads_first(c["v"])
    if contiguous_pools:
        k, v = k.contiguous(), v.contiguous()
    out, lse = torch.ops.fmha.attention(heads_first(c["q"]), k, v, None, None, None, torch.from_numpy(c["lengths"]),
                                        None, None, None, None, torch.from_numpy(c["sinks"]),
                                        _lib.CAUSAL_BOTTOM_RIGHT, 0.25, [-1, -1], 0.0, [128, 1], 1, 0.0, 0, 0,
                                        torch.from_numpy(c["table"]))
    check_paged(tokens_first(out), lse.numpy(), c["ref"])


def test_paged_not_causal():
    c = paged_case(22, 3, 4, 2, 16, is_causal=False)
    check_paged(tokens_first(sdpa_paged(c)), None, c["ref"])


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_cache_dtype_contiguous(kv_dtype):
    """A float32 query with a bf16 / f16 cache, not paged: the reference on
    the rounded values, and the same bits as float32 key and value."""
    gen = torch.Generator().manual_seed(3)
    B, H, HKV, L, S, E = 2, 4, 2, 6, 40, 16
    q = torch.rand(B, H, L, E, generator=gen) * 2 - 1
    k, v = ((torch.rand(B, HKV, S, E, generator=gen) * 2 - 1).to(kv_dtype) for _ in range(2))
    kw = dict(enable_gqa=True, is_causal=True, causal_alignment="bottom_right",
              key_value_seq_lengths=torch.tensor([S, 23], dtype=torch.int32))
    out = FT.scaled_dot_product_attention(q, k, v, **kw)
    assert out.dtype == torch.float32
    ref = reference(tokens_first(q), tokens_first(k), tokens_first(v), is_causal=True,
                    causal_alignment="bottom_right", kv_lengths=[S, 23])
    assert rel_error(tokens_first(out), ref["o"]) < 2e-5
    assert torch.equal(out, FT.scaled_dot_product_attention(q, k.float(), v.float(), **kw))


def test_plans_tell_cache_dtypes_apart():
    """Calls that differ only in the cache's dtype (planned calls: no
    per-call arrays) each get their own plan."""
    gen = torch.Generator().manual_seed(4)
    q = torch.rand(2, 4, 3, 16, generator=gen)
    k, v = (torch.rand(2, 2, 24, 16, generator=gen) for _ in range(2))
    results = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float32):
        kd, vd = k.to(dtype), v.to(dtype)
        out = FT.scaled_dot_product_attention(q, kd, vd, enable_gqa=True, is_causal=True)
        ref = reference(tokens_first(q), tokens_first(kd), tokens_first(vd), is_causal=True)
        assert rel_error(tokens_first(out), ref["o"]) < 2e-5, dtype
        results.setdefault(dtype, out)
        assert torch.equal(out, results[dtype])


@pytest.mark.parametrize("kv_dtype,page", [(np.float32, 1), (np.float32, 4), (BF16, 16)], ids=["f32-1", "f32-4",
                                                                                               "bf16-16"])
def test_prefill_then_decode_equals_one_causal_forward(kv_dtype, page):
    def attend(q, k, v, table, kv_lengths, q_lengths):
        # the pools change between calls: each call sees them as they are now
        out = FT.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), enable_gqa=True,
                                              is_causal=True, causal_alignment="bottom_right", block_table=table,
                                              key_value_seq_lengths=kv_lengths, query_seq_lengths=q_lengths)
        return tokens_first(out)

    out, q, k, v = prefill_then_decode(attend, np.random.default_rng(page), page=page, kv_dtype=kv_dtype)
    full = FT.scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), enable_gqa=True,
                                           is_causal=True)
    assert rel_error(out, tokens_first(full)) < 1e-5
    assert rel_error(out, reference(q, np.asarray(k, np.float64), np.asarray(v, np.float64), is_causal=True)["o"]) \
        < 2e-5


def test_opcheck_and_compile_with_block_table():
    c = paged_case(23, 2, 4, 2, 8, sinks=True)
    args = (heads_first(c["q"]), heads_first(c["k"]), heads_first(c["v"]), None, None, None,
            torch.from_numpy(c["lengths"]), None, None, None, None, torch.from_numpy(c["sinks"]),
            _lib.CAUSAL_BOTTOM_RIGHT, 0.25, [-1, -1], 0.0, [128, 1], 1, 0.0, 0, 0, torch.from_numpy(c["table"]))
    torch.library.opcheck(torch.ops.fmha.attention.default, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    want = tokens_first(torch.ops.fmha.attention(*args)[0])
    check_paged(want, None, c["ref"])
    op = torch.compile(lambda *a: torch.ops.fmha.attention(*a)[0], backend="aot_eager", fullgraph=True)
    assert np.array_equal(tokens_first(op(*args)), want)
    f = torch.compile(lambda q, k, v, t, n: FT.scaled_dot_product_attention(
        q, k, v, enable_gqa=True, is_causal=True, causal_alignment="bottom_right", block_table=t,
        key_value_seq_lengths=n, sinks=args[11]), backend="aot_eager")
    out = f(args[0], args[1], args[2], args[-1], args[6])
    assert np.array_equal(tokens_first(out), want)


def test_errors():
    c = paged_case(24, 2, 4, 2, 4)
    q, k, v = (heads_first(c[name]) for name in ("q", "k", "v"))
    table, lengths = torch.from_numpy(c["table"]), torch.from_numpy(c["lengths"])
    sdpa = FT.scaled_dot_product_attention
    kw = dict(enable_gqa=True, key_value_seq_lengths=lengths)
    with pytest.raises(ValueError, match="needs key_value_seq_lengths"):
        sdpa(q, k, v, enable_gqa=True, block_table=table)
    with pytest.raises(ValueError, match="block_table must be"):
        sdpa(q, k, v, block_table=table[:1], **kw)
    with pytest.raises(ValueError, match="block_table must be"):
        sdpa(q, k, v, block_table=table[:, :, None], **kw)
    with pytest.raises(TypeError, match="integers"):
        sdpa(q, k, v, block_table=table.float(), **kw)
    with pytest.raises(ValueError, match=r"block_table needs query \[B, H, L, E\]"):
        sdpa(q[0], k[0], v[0], block_table=table, **kw)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        sdpa(q, k, v[:-1], block_table=table, **kw)
    with pytest.raises(ValueError, match="key_value_seq_lengths"):  # past max_pages * page_size
        sdpa(q, k, v, block_table=table, enable_gqa=True,
             key_value_seq_lengths=torch.tensor([table.shape[1] * k.shape[2] + 1, 1, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table must be int32"):  # the op itself
        torch.ops.fmha.attention(q, k, v, None, None, None, lengths, None, None, None, None, None, 0, 0.25,
                                 [-1, -1], 0.0, [128, 1], 1, 0.0, 0, 0, table.long())
    # a page index past the pools, or negative, inside a sequence's length
    for entry in (k.shape[0], -1):
        bad = table.clone()
        bad[0, 0] = entry
        with pytest.raises(FmhaError, match="block table entry is invalid.*FMHA_ERR_BAD_PAGE"):
            sdpa(q, k, v, block_table=bad, **kw)
    sdpa(q, k, v, block_table=table, **kw)  # entries past each sequence's pages (-1 here) are never read
    # what the paged driver does not serve
    with pytest.raises(FmhaError, match="FMHA_ERR_UNSUPPORTED"):
        sdpa(q, k, v, torch.zeros(1, 1, 1, 1), block_table=table, **kw)
    # cache dtypes fmha does not serve
    with pytest.raises(TypeError, match="share a dtype"):
        sdpa(q.half(), k.bfloat16(), v.bfloat16(), block_table=table, **kw)
    with pytest.raises(TypeError, match="share a dtype"):
        sdpa(q, k.bfloat16(), v.half(), block_table=table, **kw)
    with pytest.raises(TypeError, match="share a dtype"):
        sdpa(q.bfloat16(), k, v, block_table=table, **kw)


def test_no_backward():
    """Paged caches and caches of their own dtype are forward only: the
    backward is a clear FmhaError; without gradients they run."""
    c = paged_case(25, 2, 4, 2, 4)
    q, k, v = (heads_first(c[name]) for name in ("q", "k", "v"))
    kw = dict(enable_gqa=True, block_table=c["table"], key_value_seq_lengths=c["lengths"], is_causal=True,
              causal_alignment="bottom_right")
    for wants_grad in ((True, False, False), (False, True, True)):
        leaves = [t.clone().requires_grad_(w) for t, w in zip((q, k, v), wants_grad)]
        out = FT.scaled_dot_product_attention(*leaves, **kw)
        with pytest.raises(FmhaError, match="block_table.*forward only") as e:
            out.sum().backward()
        assert e.value.unsupported
    kb = torch.zeros(2, 2, 8, 16, dtype=torch.bfloat16)
    qf = torch.zeros(2, 4, 3, 16, requires_grad=True)
    with pytest.raises(FmhaError, match="cache dtype.*forward only"):
        FT.scaled_dot_product_attention(qf, kb, kb, enable_gqa=True).sum().backward()
    with torch.no_grad():
        out = FT.scaled_dot_product_attention(q.clone().requires_grad_(), k, v, **kw)
    check_paged(tokens_first(out), None, c["ref"])
