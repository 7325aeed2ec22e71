"""test_torch_keywords: fmha.torch.scaled_dot_product_attention's native
keywords (segment_ids, alibi_slopes, rel_table, softcap, causal_alignment,
local_window_size, sequence lengths, precision, sinks) against the float64
NumPy reference of conftest: outputs, the gradients of query, key, value
and of the differentiable parameters (alibi_slopes, rel_table, sinks),
opcheck of both custom ops, torch.compile of one case, the errors, and
autocast on CPU with mixed float32 / 16-bit inputs, and [..., H, L, E]
inputs with any leading dims against PyTorch's SDPA; dropout_p against
the reference given the C library's draw.
Skipped when PyTorch is not installed."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import fmha.torch as FT  # noqa: E402
from fmha import _lib  # noqa: E402

from conftest import reference, rel_error, require  # noqa: E402
from test_numpy_api import dropout_factors  # noqa: E402  (the C library's draw, float64)

TOL = 2e-5  # float32 against float64
B, H, HKV, L, S, E = 2, 4, 2, 10, 12, 8


def rnd(gen, *shape):
    return torch.rand(*shape, generator=gen) * 2 - 1


def bthe(t):
    """[B, H, L, E] tensor -> [B, L, H, E] float64 array (the reference's layout)."""
    return t.detach().double().transpose(1, 2).numpy()


def inputs(seed, seq_q=L):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rnd(gen, B, H, seq_q, E), rnd(gen, B, HKV, S, E), rnd(gen, B, HKV, S, E)
    d_o = rnd(gen, B, H, seq_q, E)
    return gen, q, k, v, d_o


def check(q, k, v, d_o, kw, ref_kw, params=()):
    """Forward and gradients of fmha.torch with keywords kw against the
    reference with ref_kw; params names the keywords whose gradients count
    (their reference gradient is d_<name> under the reference's names)."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kw = dict(kw)
    for name in params:
        kw[name] = kw[name].clone().requires_grad_()
    out = FT.scaled_dot_product_attention(*leaves, enable_gqa=True, **kw)
    (out * d_o).sum().backward()
    want = reference(bthe(q), bthe(k), bthe(v), d_out=bthe(d_o), **ref_kw)
    assert rel_error(bthe(out), want["o"]) < TOL
    for name, t in zip(("dq", "dk", "dv"), leaves):
        assert rel_error(bthe(t.grad), want[name]) < TOL, name
    ref_names = {"alibi_slopes": "d_alibi", "rel_table": "d_rel_table", "sinks": "d_sinks"}
    for name in params:
        assert kw[name].grad is not None, name
        assert rel_error(kw[name].grad.numpy(), want[ref_names[name]]) < TOL, name


def test_segment_ids_one_tensor():
    require("segments")
    gen, q, k, v, d_o = inputs(1, seq_q=S)
    ids = torch.tensor([[0] * 5 + [1] * 7, [0] * 3 + [1] * 4 + [2] * 5])
    check(q, k, v, d_o, dict(segment_ids=ids), dict(segment_ids=ids.numpy()))


def test_segment_ids_pair():
    require("segments")
    gen, q, k, v, d_o = inputs(2)
    q_ids = torch.tensor([[0] * 4 + [1] * 6, [1] * 10])
    kv_ids = torch.tensor([[0] * 6 + [1] * 6, [0] * 2 + [1] * 10])
    check(q, k, v, d_o, dict(segment_ids=(q_ids, kv_ids)), dict(segment_ids=(q_ids.numpy(), kv_ids.numpy())))


def test_alibi_slopes_and_gradient():
    require("alibi")
    gen, q, k, v, d_o = inputs(3)
    slopes = torch.rand(H, generator=gen)
    check(q, k, v, d_o, dict(alibi_slopes=slopes, is_causal=True), dict(alibi=slopes.numpy(), is_causal=True),
          params=("alibi_slopes",))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_rel_table_and_gradient(bidirectional):
    require("rel_table")
    gen, q, k, v, d_o = inputs(4)
    table = rnd(gen, H, 8)
    check(q, k, v, d_o, dict(rel_table=table, rel_max_distance=6, rel_bidirectional=bidirectional),
          dict(rel_table=table.numpy(), rel_max_distance=6, rel_bidirectional=bidirectional), params=("rel_table",))


def test_softcap():
    require("softcap")
    gen, q, k, v, d_o = inputs(5)
    check(q * 4, k * 4, v, d_o, dict(softcap=2.0), dict(softcap=2.0))


def test_bottom_right_causal():
    require("bottom_right")
    gen, q, k, v, d_o = inputs(6, seq_q=4)
    kw = dict(is_causal=True, causal_alignment="bottom_right")
    check(q, k, v, d_o, kw, kw)


@pytest.mark.parametrize("window", [3, (2, 0), (None, 1)])
def test_local_window(window):
    require("window")
    gen, q, k, v, d_o = inputs(7)
    check(q, k, v, d_o, dict(local_window_size=window), dict(window=window))


@pytest.mark.parametrize("seq_q", [4, 15])
def test_bottom_right_window_and_alibi_without_causal(seq_q):
    """causal_alignment='bottom_right' without is_causal places the window
    and ALiBi at i + S - L against j (FlashAttention's rule)."""
    gen, q, k, v, d_o = inputs(8, seq_q=seq_q)
    slopes = rnd(gen, H).abs()
    check(q, k, v, d_o, dict(causal_alignment="bottom_right", local_window_size=(3, 1), alibi_slopes=slopes),
          dict(causal_alignment="bottom_right", window=(3, 1), alibi=slopes.double().numpy()), params=("alibi_slopes",))


def test_sequence_lengths():
    require("q_lengths", "kv_lengths")
    gen, q, k, v, d_o = inputs(8)
    ql, kl = torch.tensor([7, 10]), torch.tensor([12, 5])
    check(q, k, v, d_o, dict(query_seq_lengths=ql, key_value_seq_lengths=kl),
          dict(q_lengths=ql.numpy(), kv_lengths=kl.numpy()))


def test_sinks_and_gradient():
    gen, q, k, v, d_o = inputs(9)
    sinks = rnd(gen, H)
    check(q, k, v, d_o, dict(sinks=sinks, is_causal=True), dict(sinks=sinks.numpy(), is_causal=True),
          params=("sinks",))


def test_all_parameters_together():
    require("alibi", "rel_table", "segments", "kv_lengths")
    gen, q, k, v, d_o = inputs(10, seq_q=S)
    slopes, table, sinks = torch.rand(H, generator=gen), rnd(gen, H, 6), rnd(gen, H)
    ids = torch.tensor([[0] * 6 + [1] * 6, [0] * 12])
    kl = torch.tensor([12, 9])
    check(q, k, v, d_o,
          dict(alibi_slopes=slopes, rel_table=table, sinks=sinks, segment_ids=ids, key_value_seq_lengths=kl,
               is_causal=True),
          dict(alibi=slopes.numpy(), rel_table=table.numpy(), sinks=sinks.numpy(), segment_ids=ids.numpy(),
               kv_lengths=kl.numpy(), is_causal=True),
          params=("alibi_slopes", "rel_table", "sinks"))


@pytest.mark.parametrize("precision", ["fast", "accurate"])
def test_precision_bf16(precision):
    require("bfloat16")
    gen, q, k, v, d_o = inputs(11)
    q16, k16, v16 = (t.bfloat16() for t in (q, k, v))
    out = FT.scaled_dot_product_attention(q16, k16, v16, enable_gqa=True, precision=precision)
    want = reference(bthe(q16), bthe(k16), bthe(v16))["o"]
    assert out.dtype == torch.bfloat16
    assert rel_error(bthe(out), want) < 1e-2


def test_three_d_inputs_with_keywords():
    require("alibi", "kv_lengths")
    gen, q, k, v, d_o = inputs(12)
    slopes = torch.rand(H, generator=gen)
    out = FT.scaled_dot_product_attention(q[1], k[1], v[1], enable_gqa=True, alibi_slopes=slopes,
                                          key_value_seq_lengths=7)
    want = reference(bthe(q[1:]), bthe(k[1:]), bthe(v[1:]), alibi=slopes.numpy(), kv_lengths=[7])["o"]
    assert rel_error(bthe(out[None]), want) < TOL


def test_opcheck_with_keywords():
    require("alibi", "rel_table", "kv_lengths")
    gen, q, k, v, d_o = inputs(13)
    slopes, table, sinks = torch.rand(H, generator=gen), rnd(gen, H, 6), rnd(gen, H)
    kl = torch.tensor([12, 9], dtype=torch.int32)
    ids = torch.zeros(B, L, dtype=torch.int32), torch.zeros(B, S, dtype=torch.int32)
    args = (q, k, v, None, None, None, kl, *ids, slopes.requires_grad_(), table.requires_grad_(),
            sinks.requires_grad_(), _lib.CAUSAL_BOTTOM_RIGHT, 0.3, [4, -1], 5.0, [16, 1], 1, 0.2, 7, 3)
    torch.library.opcheck(torch.ops.fmha.attention.default, args)
    o, lse = torch.ops.fmha.attention(*args)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args[3:]]
    bwd = (q, k, v, o.detach(), lse.detach(), d_o, *detached, [False, True, True, True])
    torch.library.opcheck(torch.ops.fmha.attention_backward.default, bwd)


def test_compile_with_alibi():
    require("alibi")
    gen, q, k, v, d_o = inputs(14)
    slopes = torch.rand(H, generator=gen).requires_grad_()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    f = torch.compile(lambda q, k, v, s: (FT.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                                            alibi_slopes=s, softcap=3.0,
                                                                            local_window_size=(4, 2)) * d_o).sum(),
                      backend="aot_eager", fullgraph=True)
    f(*leaves, slopes).backward()
    want = reference(bthe(q), bthe(k), bthe(v), alibi=slopes.detach().numpy(), softcap=3.0, window=(4, 2),
                     d_out=bthe(d_o))
    for name, t in zip(("dq", "dk", "dv"), leaves):
        assert rel_error(bthe(t.grad), want[name]) < TOL, name
    assert rel_error(slopes.grad.numpy(), want["d_alibi"]) < TOL


def test_keyword_errors():
    gen, q, k, v, d_o = inputs(15)
    sdpa = FT.scaled_dot_product_attention
    with pytest.raises(ValueError, match="alibi_slopes"):
        sdpa(q, k, v, enable_gqa=True, alibi_slopes=torch.ones(H + 1))
    with pytest.raises(ValueError, match="rel_table"):
        sdpa(q, k, v, enable_gqa=True, rel_table=torch.ones(H))
    with pytest.raises(ValueError, match="sinks must be finite"):
        sdpa(q, k, v, enable_gqa=True, sinks=torch.full((H,), float("inf")))
    with pytest.raises(ValueError, match="softcap"):
        sdpa(q, k, v, enable_gqa=True, softcap=-1.0)
    with pytest.raises(ValueError, match="causal_alignment"):
        sdpa(q, k, v, enable_gqa=True, is_causal=True, causal_alignment="middle")
    with pytest.raises(ValueError, match="precision"):
        sdpa(q, k, v, enable_gqa=True, precision="exact")
    with pytest.raises(ValueError, match="local_window_size"):
        sdpa(q, k, v, enable_gqa=True, local_window_size=-2)
    with pytest.raises(ValueError, match="key_value_seq_lengths"):
        sdpa(q, k, v, enable_gqa=True, key_value_seq_lengths=torch.tensor([3, S + 1]))
    with pytest.raises(ValueError, match="L == S"):
        sdpa(q, k, v, enable_gqa=True, segment_ids=torch.zeros(B, L, dtype=torch.int32))
    with pytest.raises(ValueError, match="q_segment_ids"):
        sdpa(q, k, v, enable_gqa=True, segment_ids=(torch.zeros(B, S, dtype=torch.int32),) * 2)
    with pytest.raises(TypeError, match="integers"):
        sdpa(q, k, v, enable_gqa=True, query_seq_lengths=torch.ones(B))
    with pytest.raises(TypeError):  # the native keywords are keyword-only
        sdpa(q, k, v, None, 0.0, False, None, True, torch.zeros(B, S, dtype=torch.int32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_mixed_inputs(dtype):
    require(dtype)
    dt = getattr(torch, dtype)
    gen, q, k, v, d_o = inputs(16)
    leaves = [q.clone().requires_grad_(), k.to(dt).requires_grad_(), v.clone().requires_grad_()]
    with torch.autocast("cpu", dtype=dt):
        out = FT.scaled_dot_product_attention(*leaves, enable_gqa=True, is_causal=True)
        direct, _ = torch.ops.fmha.attention(*leaves, *(None,) * 9, _lib.CAUSAL_TOP_LEFT, 0.35, [-1, -1], 0.0,
                                             [128, 1], 1, 0.0, 0, 0)
    assert out.dtype == dt and direct.dtype == dt
    (out.float() * d_o).sum().backward()
    low = [t.detach().to(dt) for t in (q, k, v)]  # the inputs as the kernels see them
    want = reference(*(bthe(t) for t in low), is_causal=True, d_out=bthe(d_o.to(dt)))
    assert rel_error(bthe(out), want["o"]) < 2e-2
    for name, t, leaf_dtype in zip(("dq", "dk", "dv"), leaves, (torch.float32, dt, torch.float32)):
        assert t.grad.dtype == leaf_dtype, name
        assert rel_error(bthe(t.grad), want[name]) < 3e-2, name
    with torch.autocast("cpu", dtype=dt):
        theirs = torch.nn.functional.scaled_dot_product_attention(
            q, k.to(dt), v, is_causal=True, enable_gqa=True)
    assert theirs.dtype == out.dtype


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 2)])
def test_leading_batch_dims(lead):
    """[..., H, L, E] inputs flatten into one batch dim; a mask broadcasts
    over the leading dims as in PyTorch's SDPA; gradients keep the shapes."""
    require("bias")
    gen = torch.Generator().manual_seed(len(lead) + 20)
    q, k, v = rnd(gen, *lead, 4, 6, 8), rnd(gen, *lead, 2, 9, 8), rnd(gen, *lead, 2, 9, 8)
    d_o = rnd(gen, *lead, 4, 6, 8)
    bias = rnd(gen, *(lead[-1:] if lead else ()), 1, 6, 9)  # broadcast over all but the last leading dim
    ours = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out = FT.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3], enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(*theirs[:3], attn_mask=theirs[3],
                                                            enable_gqa=True)
    assert out.shape == want.shape
    assert rel_error(out.detach().numpy(), want.detach().numpy()) < TOL
    (out * d_o).sum().backward()
    (want * d_o).sum().backward()
    for a, b in zip(ours, theirs):
        assert a.grad.shape == b.grad.shape
        assert rel_error(a.grad.numpy(), b.grad.numpy()) < TOL


def test_leading_dims_keep_views_and_keywords():
    """A [..., H, L, E] view whose leading dims merge reaches the C library
    without a copy (its data pointer), and per-batch keywords take the
    leading dims' shape."""
    require("kv_lengths")
    gen = torch.Generator().manual_seed(30)
    q, k, v = rnd(gen, 2, 3, 4, 6, 8), rnd(gen, 2, 3, 4, 9, 8), rnd(gen, 2, 3, 4, 9, 8)
    lengths = torch.tensor([[9, 4, 1], [7, 9, 2]])
    seen = []
    run = FT._attention  # what every call runs: the op, or its kernel directly when eager

    def spy(*args):
        seen.append(args[0].data_ptr())
        return run(*args)

    FT._attention = spy
    try:
        out = FT.scaled_dot_product_attention(q, k, v, key_value_seq_lengths=lengths)
    finally:
        FT._attention = run
    assert seen == [q.data_ptr()]
    flat = [t.reshape(6, 4, -1, 8) for t in (q, k, v)]
    want = reference(*(bthe(t) for t in flat), kv_lengths=lengths.reshape(-1).numpy())["o"]
    assert out.shape == (2, 3, 4, 6, 8)
    assert rel_error(bthe(out.reshape(6, 4, 6, 8)), want) < TOL
    with pytest.raises(ValueError, match="leading dims"):  # (2, 2) and (2, 3) do not broadcast
        FT.scaled_dot_product_attention(q, k[:, :2], v[:, :2])


def test_two_d_inputs():
    require("mask")
    gen = torch.Generator().manual_seed(31)
    q, k, v = rnd(gen, 5, 8), rnd(gen, 7, 8), rnd(gen, 7, 4)
    mask = torch.rand(5, 7, generator=gen) > 0.3
    mask[:, 0] = True
    out = FT.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.shape == want.shape == (5, 4)
    assert rel_error(out.numpy(), want.numpy()) < TOL


def test_dropout_matches_the_reference_with_the_same_draw():
    gen, q, k, v, d_o = inputs(32)
    p, seed, offset = 0.3, 2**62 + 9, 17
    z = dropout_factors((B, H, L, S), p, seed, offset)
    kw = dict(dropout_p=p, dropout_seed=seed, dropout_offset=offset, is_causal=True)
    check(q, k, v, d_o, kw, dict(dropout=z, is_causal=True))
    # without a seed, each call draws one from torch's default generator
    torch.manual_seed(5)
    a = FT.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    b = FT.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True)
    torch.manual_seed(5)
    assert torch.equal(a, FT.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True))
    assert not torch.equal(a, b)
    with pytest.raises(ValueError, match="dropout_seed"):
        FT.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=True, dropout_seed=-1)
