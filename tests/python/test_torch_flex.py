"""test_torch_flex: fmha.torch.flex_attention with PyTorch's BlockMask
(causal, sliding window, document, random block-sparse; block sizes 128 and
others, sequences not multiples of them; masks broadcast over B and H; GQA)
against PyTorch's own flex_attention forward on CPU, and forward, lse and
gradients against the float64 reference of conftest on the same mask
written densely in NumPy. Skipped when PyTorch is not installed, unless
FMHA_REQUIRE_TORCH=1."""

import os

import numpy as np
import pytest

try:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex_attention
except ImportError:
    torch = None

if torch is None:
    if os.environ.get("FMHA_REQUIRE_TORCH") == "1":
        raise RuntimeError("FMHA_REQUIRE_TORCH=1 but PyTorch (with torch.nn.attention.flex_attention) is not "
                           "importable")
    pytestmark = pytest.mark.skip(reason="PyTorch with torch.nn.attention.flex_attention is not installed "
                                         "(FMHA_REQUIRE_TORCH=1 makes this a failure)")
else:
    import fmha.torch as FT
    from fmha._torch_flex import block_mask_operands, dense_mask

from conftest import reference, rel_error, require  # noqa: E402

# float32 kernels against float64 / PyTorch's float32 flex (relative L2)
TOL = 2e-5
# gradients accumulate over more terms
GRAD_TOL = 5e-5
RANDOM_BLOCK = 16


def masks(Bm, Hm, L, S, seed):
    """name -> (mask_mod for torch, the same mask as NumPy over index grids
    b [Bm,1,1,1], h [1,Hm,1,1], q [1,1,L,1], kv [1,1,1,S]). The masks depend
    on b and h only through b % Bm and h % Hm: a BlockMask made with B=None
    (Bm = 1) or H=None (Hm = 1) must not depend on them, as PyTorch has it."""
    rng = np.random.default_rng(seed)
    doc = np.sort(rng.integers(0, 4, size=(Bm, max(L, S))), axis=1)
    doc_t = torch.from_numpy(doc)
    keep = rng.random((Bm, Hm, -(-L // RANDOM_BLOCK), -(-S // RANDOM_BLOCK))) < 0.5
    keep_t = torch.from_numpy(keep)
    window = 37
    return {
        "causal": (lambda b, h, q, kv: q >= kv, lambda b, h, q, kv: q >= kv),
        "sliding_window": (lambda b, h, q, kv: (q >= kv) & (q - kv <= window),
                           lambda b, h, q, kv: (q >= kv) & (q - kv <= window)),
        "document": (lambda b, h, q, kv: doc_t[b % Bm, q] == doc_t[b % Bm, kv],
                     lambda b, h, q, kv: doc[b % Bm, q] == doc[b % Bm, kv]),
        "random_blocks": (
            lambda b, h, q, kv: keep_t[b % Bm, h % Hm, q // RANDOM_BLOCK, kv // RANDOM_BLOCK] | (q == kv),
            lambda b, h, q, kv: keep[b % Bm, h % Hm, q // RANDOM_BLOCK, kv // RANDOM_BLOCK] | (q == kv)),
    }


def numpy_mask(fn, Bm, Hm, L, S):
    b = np.arange(Bm)[:, None, None, None]
    h = np.arange(Hm)[None, :, None, None]
    q = np.arange(L)[None, None, :, None]
    kv = np.arange(S)[None, None, None, :]
    return np.broadcast_to(fn(b, h, q, kv), (Bm, Hm, L, S))


def inputs(B, H, Hkv, L, S, E, seed):
    """q, k, v, d_o uniform in [-1, 1)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, E), (B, Hkv, S, E), (B, Hkv, S, E), (B, H, L, E))
    return tuple(torch.rand(*shape, generator=gen) * 2 - 1 for shape in shapes)


def to_bthe(t):
    return t.detach().double().numpy().transpose(0, 2, 1, 3)


def fmha_run(q, k, v, d_o, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = FT.flex_attention(*leaves, return_lse=True, **kw)
    (o * d_o).sum().backward()
    return o.detach(), lse.detach(), [t.grad for t in leaves]


def check_against_reference(q, k, v, d_o, dense, ours, **ref_kw):
    o, lse, grads = ours
    ref = reference(to_bthe(q), to_bthe(k), to_bthe(v), mask=dense, d_out=to_bthe(d_o), **ref_kw)
    assert rel_error(to_bthe(o), ref["o"]) < TOL
    finite = np.isfinite(ref["lse"])
    assert np.array_equal(np.isfinite(lse.numpy()), finite)
    assert rel_error(lse.numpy()[finite], ref["lse"][finite]) < TOL
    for g, name in zip(grads, ("dq", "dk", "dv")):
        assert rel_error(to_bthe(g), ref[name]) < GRAD_TOL, name


# (B, H, Hkv, L, S, E, BLOCK_SIZE, mask over B, mask over H)
CASES = [
    (2, 2, 2, 256, 256, 16, 128, True, True),
    (1, 2, 2, 200, 200, 16, 128, False, False),
    (2, 4, 2, 150, 150, 8, 64, True, False),
    (1, 4, 1, 96, 130, 16, 48, False, True),
    (2, 2, 2, 100, 100, 8, (32, 48), True, True),
]


NAMES = ["causal", "sliding_window", "document", "random_blocks"]
ALIBI_SLOPES = [0.5, 0.25, 0.125]


def case_id(case):
    return "x".join(str(x) for x in case[:7])


def block_mask_case(case, name):
    """(q, k, v, d_o, block_mask, enable_gqa, the mask as NumPy [Bm, Hm, L, S])."""
    B, H, Hkv, L, S, E, block, per_b, per_h = case
    seed = B * 1000 + L + S + len(name)
    Bm, Hm = (B if per_b else 1), (H if per_h else 1)
    mask_mod, np_fn = masks(Bm, Hm, L, S, seed)[name]
    q, k, v, d_o = inputs(B, H, Hkv, L, S, E, seed)
    bm = create_block_mask(mask_mod, B if per_b else None, H if per_h else None, L, S, device="cpu",
                           BLOCK_SIZE=block)
    return q, k, v, d_o, bm, H != Hkv, numpy_mask(np_fn, Bm, Hm, L, S)


def score_mod_case():
    q, k, v, d_o = inputs(2, 3, 3, 70, 90, 16, 9)
    return q, k, v, d_o, torch.tensor(ALIBI_SLOPES), 3.0, 0.4


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("name", NAMES)
def test_block_masks(case, name):
    require("mask")
    q, k, v, d_o, bm, gqa, dense = block_mask_case(case, name)
    ours = fmha_run(q, k, v, d_o, block_mask=bm, enable_gqa=gqa)

    theirs, their_lse = torch_flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa, return_lse=True)
    seen = torch.isfinite(their_lse)
    assert rel_error(ours[0][seen].numpy(), theirs[seen].numpy()) < TOL
    assert rel_error(ours[1][seen].numpy(), their_lse[seen].numpy()) < TOL

    check_against_reference(q, k, v, d_o, dense, ours)


def test_dense_mask_matches_block_mask_to_dense():
    B, H, L, S = 2, 3, 77, 190
    mask_mod, np_fn = masks(B, H, L, S, 5)["random_blocks"]
    bm = create_block_mask(mask_mod, B, H, L, S, device="cpu", BLOCK_SIZE=32)
    dense = dense_mask(bm, L, S)
    assert dense.shape == (B, H, L, S)
    assert np.array_equal(dense.numpy(), numpy_mask(np_fn, B, H, L, S))
    # block classes: no True inside a block the BlockMask calls empty
    blocks = bm.to_dense()[..., :3, :6].repeat_interleave(32, 2).repeat_interleave(32, 3)[..., :L, :S]
    assert not (dense & ~blocks.bool()).any()


def test_no_block_mask_alibi_and_softcap():
    require("alibi", "softcap")
    q, k, v, d_o, slopes, cap, scale = score_mod_case()
    slopes_leaf = slopes.clone().requires_grad_()
    ours = fmha_run(q, k, v, d_o, fmha_bias=dict(alibi_slopes=slopes_leaf, softcap=cap), scale=scale)
    check_against_reference(q, k, v, d_o, None, ours, alibi=slopes.numpy(), softcap=cap, scale=scale)
    ref = reference(to_bthe(q), to_bthe(k), to_bthe(v), alibi=slopes.numpy(), softcap=cap, scale=scale,
                    d_out=to_bthe(d_o))
    assert rel_error(slopes_leaf.grad.numpy(), ref["d_alibi"]) < GRAD_TOL
    # the score_mod PyTorch takes for the same scores
    theirs = torch_flex_attention(
        q, k, v, scale=scale,
        score_mod=lambda s, b, h, qi, kv: cap * torch.tanh(s / cap) - slopes[h] * (qi - kv).abs())
    assert rel_error(ours[0].numpy(), theirs.numpy()) < TOL


def test_rows_without_keys_give_zero_and_minus_inf():
    require("mask")
    B, H, L, E = 1, 2, 64, 8
    q, k, v, d_o = inputs(B, H, H, L, L, E, 3)
    bm = create_block_mask(lambda b, h, qi, kv: (qi >= 10) & (kv <= qi), None, None, L, L, device="cpu",
                           BLOCK_SIZE=16)
    ours = fmha_run(q, k, v, d_o, block_mask=bm)
    assert (ours[0][:, :, :10] == 0).all() and torch.isneginf(ours[1][:, :, :10]).all()
    dense = numpy_mask(lambda b, h, qi, kv: (qi >= 10) & (kv <= qi), 1, 1, L, L)
    check_against_reference(q, k, v, d_o, dense, ours)


def test_errors():
    q, k, v, _ = inputs(1, 2, 2, 32, 32, 8, 1)
    with pytest.raises(NotImplementedError, match="score_mod"):
        FT.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s * 2)
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, 64, 64, device="cpu")
    with pytest.raises(ValueError, match="sequence lengths"):
        FT.flex_attention(q, k, v, block_mask=bm)
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, 3, None, 32, 32, device="cpu")
    with pytest.raises(ValueError, match="block_mask is for batch 3"):
        FT.flex_attention(q, k, v, block_mask=bm)
    with pytest.raises(ValueError, match="alibi_slopes"):
        FT.flex_attention(q, k, v, fmha_bias=dict(alibi_slopes=torch.ones(3)))
    with pytest.raises(ValueError, match="fmha_bias takes"):
        FT.flex_attention(q, k, v, fmha_bias=dict(rel_table=torch.ones(2, 4)))
    with pytest.raises(ValueError, match="softcap"):
        FT.flex_attention(q, k, v, fmha_bias=dict(softcap=-1.0))
    with pytest.raises(ValueError, match="4-D"):
        FT.flex_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="enable_gqa"):
        FT.flex_attention(q, k[:, :1], v[:, :1])
    o, lse = FT.flex_attention(q.clone().requires_grad_(), k, v, return_lse=True)
    assert o.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("L, S, block", [(256, 256, 128), (200, 200, 128), (96, 130, 48), (100, 100, (32, 48))])
def test_causal_and_sliding_block_masks_run_natively(L, S, block):
    def causal(b, h, qi, kv):
        return qi >= kv

    def sliding(b, h, qi, kv):
        return (qi >= kv) & (qi - kv <= 37)

    def strictly_causal(b, h, qi, kv):   # same blocks, differs inside the diagonal ones
        return qi > kv

    def sliding_and_first_key(b, h, qi, kv):
        return ((qi >= kv) & (qi - kv <= 37)) | (kv == 0)

    def per_head(b, h, qi, kv):          # causal on head 0 only
        return (qi >= kv) | (h == 1)

    for mod, band in ((causal, -1), (sliding, 37)):
        bm = create_block_mask(mod, None, None, L, S, device="cpu", BLOCK_SIZE=block)
        assert block_mask_operands(bm, L, S) == (None, band)
    for mod, B, H in ((strictly_causal, None, None), (sliding_and_first_key, None, None), (per_head, 2, 2)):
        bm = create_block_mask(mod, B, H, L, S, device="cpu", BLOCK_SIZE=block)
        mask, band = block_mask_operands(bm, L, S)
        assert band is None and mask is not None
        want = numpy_mask(lambda b, h, qi, kv: mod(torch.from_numpy(np.asarray(b)), torch.from_numpy(np.asarray(h)),
                                                   torch.from_numpy(np.asarray(qi)),
                                                   torch.from_numpy(np.asarray(kv))).numpy(),
                          B or 1, H or 1, L, S)
        assert np.array_equal(mask.numpy(), want)
