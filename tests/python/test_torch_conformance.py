"""test_torch_conformance: fmha.torch.scaled_dot_product_attention where
clients lean on PyTorch's behaviour beyond plain tensors: CausalBias masks,
torch.jit.trace, expanded float masks that need a gradient, tensors on
other devices, leading dims that broadcast, empty dims, an explicit zero scale and torch.func
transforms. The reference is PyTorch's SDPA in float64 (relative L2 error
below 2e-5 for float32 results). Skipped without PyTorch."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
import torch.nn.functional as F  # noqa: E402

import fmha.torch as FT  # noqa: E402

from conftest import rel_error  # noqa: E402

TOL = 2e-5


def rnd(gen, *shape):
    return torch.rand(*shape, generator=gen) * 2 - 1


def ref(q, k, v, **kw):
    """PyTorch's SDPA in float64, as float32."""
    mask = kw.pop("attn_mask", None)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, **kw).float()


def close(a, b):
    return rel_error(a.detach().numpy(), b.detach().numpy()) < TOL


@pytest.mark.parametrize("L, S", [(3, 7), (7, 7), (9, 5)])
def test_causal_bias_masks(L, S):
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    gen = torch.Generator().manual_seed(L * S)
    q, k, v = rnd(gen, 2, 2, L, 8), rnd(gen, 2, 2, S, 8), rnd(gen, 2, 2, S, 8)
    upper = FT.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(L, S))
    assert close(upper, ref(q, k, v, is_causal=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns of NaN rows for L > S
        lower = FT.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S))
    # bottom right: query i sees keys j <= i + S - L; rows that see none give zeros
    visible = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    expect = ref(q, k, v, attn_mask=visible)
    expect[:, :, ~visible.any(1)] = 0.0
    assert close(lower, expect)
    with pytest.raises(ValueError, match="is_causal"):
        FT.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(L, S), is_causal=True)
    with pytest.raises(ValueError, match="CausalBias"):
        FT.scaled_dot_product_attention(q, k, v, attn_mask=causal_upper_left(L + 1, S))


def test_jit_trace_records_the_op():
    gen = torch.Generator().manual_seed(3)
    q, k, v = rnd(gen, 2, 2, 5, 8), rnd(gen, 2, 2, 7, 8), rnd(gen, 2, 2, 7, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(lambda a, b, c: FT.scaled_dot_product_attention(a, b, c, is_causal=True), (q, k, v))
    q2 = rnd(gen, 2, 2, 5, 8)
    assert "fmha::attention" in str(traced.graph)
    assert close(traced(q2, k, v), ref(q2, k, v, is_causal=True))


@pytest.mark.parametrize("compact, full", [((1, 1, 1, 7), (2, 2, 5, 7)), ((5, 7), (2, 2, 5, 7)),
                                            ((2, 1, 1, 7), (2, 1, 5, 7))])
def test_expanded_float_mask_gradient(compact, full):
    gen = torch.Generator().manual_seed(len(compact))
    q, k, v = rnd(gen, 2, 2, 5, 8), rnd(gen, 2, 2, 7, 8), rnd(gen, 2, 2, 7, 8)
    d_o = rnd(gen, 2, 2, 5, 8)
    base = rnd(gen, *compact)
    grads = []
    for fn, dt in ((FT.scaled_dot_product_attention, torch.float32), (F.scaled_dot_product_attention, torch.float64)):
        m = base.to(dt).detach().requires_grad_()
        out = fn(q.to(dt), k.to(dt), v.to(dt), attn_mask=m.expand(full))
        (out * d_o.to(dt)).sum().backward()
        grads.append(m.grad.float())
    assert close(grads[0], grads[1])


def test_tensors_on_other_devices_are_refused():
    q, k, v = torch.zeros(1, 2, 3, 8), torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="attn_mask is on meta"):
        FT.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match="sinks.*meta"):
        FT.scaled_dot_product_attention(q, k, v, sinks=torch.zeros(2, device="meta"))


@pytest.mark.parametrize("q_lead, k_lead, v_lead", [((2,), (1,), (1,)), ((1,), (3,), (3,)), ((2, 3), (2, 1), (1, 3)),
                                                    ((3, 1), (1, 2), (3, 2))])
@pytest.mark.parametrize("hkv", [2, 1])
def test_leading_dims_broadcast(q_lead, k_lead, v_lead, hkv):
    """Leading dims broadcast as SDPA's matmuls broadcast them, and one key
    head serves every query head without enable_gqa; gradients are summed
    over the broadcast dims (autograd's expand)."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = rnd(gen, *q_lead, 2, 5, 8), rnd(gen, *k_lead, hkv, 7, 8), rnd(gen, *v_lead, hkv, 7, 8)
    ours = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.double().requires_grad_() for t in (q, k, v)]
    for causal in (False, True):
        out = FT.scaled_dot_product_attention(*ours, is_causal=causal)
        want = F.scaled_dot_product_attention(*theirs, is_causal=causal)
        assert out.shape == want.shape
        assert close(out, want.float())
        d_o = rnd(gen, *out.shape)
        grads = torch.autograd.grad(out, ours, d_o)
        expect = torch.autograd.grad(want, theirs, d_o.double())
        for a, b, t in zip(grads, expect, ours):
            assert a.shape == t.shape and close(a, b.float())


@pytest.mark.parametrize("q_shape, kv_shape", [((0, 2, 3, 8), (0, 2, 4, 8)), ((2, 2, 0, 8), (2, 2, 4, 8)),
                                               ((2, 2, 3, 8), (2, 2, 0, 8)), ((2, 0, 3, 8), (2, 0, 4, 8)),
                                               ((0, 3, 8), (0, 4, 8))])
def test_empty_dims(q_shape, kv_shape):
    q = torch.ones(q_shape, requires_grad=True)
    k, v = torch.ones(kv_shape, requires_grad=True), torch.ones(kv_shape, requires_grad=True)
    out = FT.scaled_dot_product_attention(q, k, v)
    expect = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach())
    assert out.shape == expect.shape
    assert torch.equal(out, torch.zeros_like(expect))  # S = 0: rows that see no key
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and not t.grad.any()


def test_zero_head_dim_is_refused():
    with pytest.raises(ValueError, match="head dim"):
        FT.scaled_dot_product_attention(torch.ones(1, 2, 3, 0), torch.ones(1, 2, 4, 0), torch.ones(1, 2, 4, 4))


def test_zero_scale_gives_equal_weights():
    gen = torch.Generator().manual_seed(5)
    q, k, v = rnd(gen, 1, 2, 5, 8) * 4, rnd(gen, 1, 2, 6, 8) * 4, rnd(gen, 1, 2, 6, 8)
    out = FT.scaled_dot_product_attention(q, k, v, scale=0.0)
    assert close(out, v.mean(2, keepdim=True).expand(1, 2, 5, 8))
    # causal (top left): row i averages V rows 0..i (PyTorch's float64 math
    # kernel gives NaN here, so the mean is written out)
    counts = torch.arange(1, 6, dtype=torch.float64)[:, None]
    means = (v.double().cumsum(2)[:, :, :5] / counts).float()
    assert close(FT.scaled_dot_product_attention(q, k, v, scale=0.0, is_causal=True), means)


def test_functorch_transforms():
    gen = torch.Generator().manual_seed(7)
    q, k, v = rnd(gen, 2, 2, 5, 8), rnd(gen, 2, 2, 7, 8), rnd(gen, 2, 2, 7, 8)
    mask = rnd(gen, 5, 7)

    def loss(fn, dt):
        return lambda a, b, c, m: (fn(a, b, c, attn_mask=m) ** 2).sum() if dt is None else \
            (fn(a.to(dt), b.to(dt), c.to(dt), attn_mask=m.to(dt)) ** 2).sum()

    ours = torch.func.grad(loss(FT.scaled_dot_product_attention, None), argnums=(0, 1, 2, 3))(q, k, v, mask)
    theirs = torch.func.grad(loss(F.scaled_dot_product_attention, torch.float64), argnums=(0, 1, 2, 3))(q, k, v, mask)
    for a, b in zip(ours, theirs):
        assert close(a, b.float())

    cot = rnd(gen, 2, 2, 5, 8)
    _, vjp = torch.func.vjp(lambda a: FT.scaled_dot_product_attention(a, k, v), q)
    _, vjp_ref = torch.func.vjp(lambda a: ref(a, k, v), q)
    assert close(vjp(cot)[0], vjp_ref(cot)[0])

    jac = torch.func.jacrev(lambda a: FT.scaled_dot_product_attention(a, k[:1, :1], v[:1, :1]))(q[:1, :1, :2])
    jac_ref = torch.func.jacrev(lambda a: ref(a, k[:1, :1], v[:1, :1]))(q[:1, :1, :2])
    assert close(jac, jac_ref)

    batched = torch.func.vmap(lambda a: FT.scaled_dot_product_attention(a, k, v))(torch.stack([q, 2 * q]))
    assert close(batched[1], ref(2 * q, k, v))

    per_row = torch.func.vmap(torch.func.grad(lambda a: FT.scaled_dot_product_attention(a[None], k[:1], v[:1]).sum()))
    with pytest.raises(NotImplementedError, match="vmap of torch.func.grad"):
        per_row(q)

    # a second derivative (grad of grad; the outer grad over q, the inner
    # over k) is refused: it had come back as zeros
    def penalty(a):
        return torch.func.grad(lambda b: FT.scaled_dot_product_attention(b, k, v).sum())(a).pow(2).sum()

    def mixed(a):
        return torch.func.grad(lambda b: FT.scaled_dot_product_attention(a, b, v).sum())(k).pow(2).sum()

    for outer in (penalty, mixed):
        with pytest.raises(NotImplementedError, match="no second derivative"):
            torch.func.grad(outer)(q)


def test_output_follows_the_query_layout():
    """As PyTorch's SDPA: a query viewed from [B, L, H, E] memory (the
    transformers layout) gives O in [B, L, H, Ev] memory, so
    O.transpose(1, 2) is contiguous; a contiguous query, a contiguous O."""
    gen = torch.Generator().manual_seed(9)
    q = rnd(gen, 2, 5, 4, 16).transpose(1, 2)
    k, v = rnd(gen, 2, 7, 4, 16).transpose(1, 2), rnd(gen, 2, 7, 4, 16).transpose(1, 2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = FT.scaled_dot_product_attention(*leaves)
    assert out.stride() == F.scaled_dot_product_attention(q, k, v).stride()
    assert out.transpose(1, 2).is_contiguous()
    assert close(out, ref(q, k, v))
    out.transpose(1, 2).reshape(2, 5, 64).sum().backward()
    q64 = q.double().requires_grad_()
    F.scaled_dot_product_attention(q64, k.double(), v.double()).sum().backward()
    assert close(leaves[0].grad, q64.grad.float())
    contiguous = FT.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
    assert contiguous.is_contiguous()


def test_forward_mode_ad_is_refused():
    """Dual tensors (torch.autograd.forward_ad) raise, as PyTorch's fused
    CPU kernel does, where the tangent had been dropped silently; a dual
    level with plain inputs still runs."""
    import torch.autograd.forward_ad as fwAD

    gen = torch.Generator().manual_seed(3)
    q, k, v = rnd(gen, 1, 2, 4, 8), rnd(gen, 1, 2, 6, 8), rnd(gen, 1, 2, 6, 8)
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, torch.ones_like(q))
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            FT.scaled_dot_product_attention(dual, k, v)
        with pytest.raises(NotImplementedError, match="forward-mode AD"):
            FT.flex_attention(dual, k, v)
        assert close(FT.scaled_dot_product_attention(q, k, v), ref(q, k, v))
