"""fmha.torch.flex_attention: torch.nn.attention.flex_attention's signature
with PyTorch's own BlockMask, served by fmha's C kernels on CPU, forward and
backward.

The BlockMask becomes one dense boolean mask [Bm, Hm, L, S] (Bm, Hm: the
BlockMask's batch and head sizes, 1 when it broadcasts), built once per call:
full blocks True, empty blocks False, and mask_mod evaluated (vectorised)
on the partial blocks only. It costs L * S bytes per (Bm, Hm). fmha
classifies each of its own tiles against that mask, so tiles the BlockMask
leaves empty are skipped and full ones run unmasked. A BlockMask that is
exactly causal (q_idx >= kv_idx) or a causal sliding window
(0 <= q_idx - kv_idx <= w), checked on its blocks and the partial blocks'
values, runs as fmha's causal mask and window, with no dense mask.

score_mod: only None; the common score modifications come as fmha_bias
(ALiBi slopes, logit softcap), run natively. It runs the fmha::attention op
of _torch_core (forward, backward, plans); fmha.torch exports it.
"""

import math

import torch

from . import api
from ._torch_core import _dtype_code, _float32_param, attention_args, refuse_forward_ad

__all__ = ["flex_attention"]


def _block_grid(num_blocks, indices, num_cols):
    """[Bm, Hm, nQ, nK] bool: the blocks listed by (num_blocks, indices)."""
    cols = torch.arange(indices.shape[-1])
    listed = cols < num_blocks.unsqueeze(-1)
    # one spare column takes the unlisted entries
    grid = torch.zeros(indices.shape[:-1] + (num_cols + 1,), dtype=torch.bool)
    grid.scatter_(-1, torch.where(listed, indices.long(), num_cols), True)
    return grid[..., :num_cols]


def _evaluate_mask_mod(mask_mod, b, h, q_idx, kv_idx):
    """mask_mod on blocks: b, h [P]; q_idx [P, QB]; kv_idx [P, KB] -> [P, QB, KB] bool.

    One call on broadcasting index tensors (b, h [P, 1, 1], q_idx [P, QB, 1],
    kv_idx [P, 1, KB]), which elementwise mask_mods (comparisons, tensor
    indexing) serve; a mask_mod that needs scalar indices is vmapped as
    PyTorch does."""
    P, QB, KB = b.shape[0], q_idx.shape[1], kv_idx.shape[1]
    try:
        out = mask_mod(b[:, None, None], h[:, None, None], q_idx[:, :, None], kv_idx[:, None, :])
        return torch.as_tensor(out).to(torch.bool).expand(P, QB, KB)
    except (RuntimeError, TypeError, IndexError, ValueError):
        over_kv = torch.vmap(mask_mod, in_dims=(None, None, None, 0))
        over_q = torch.vmap(over_kv, in_dims=(None, None, 0, None))
        over_blocks = torch.vmap(over_q, in_dims=(0, 0, 0, 0))
        return over_blocks(b, h, q_idx, kv_idx).to(torch.bool)


def _band_blocks(nq, nk, QB, KB, L, S, left):
    """(full, touched) [nq, nk] bool of the band 0 <= q_idx - kv_idx <= left
    (left None: causal): blocks it leaves all visible, blocks it leaves
    some key visible in."""
    q_lo = torch.arange(nq)[:, None] * QB
    q_hi = torch.clamp(q_lo + QB, max=L) - 1
    k_lo = torch.arange(nk)[None, :] * KB
    k_hi = torch.clamp(k_lo + KB, max=S) - 1
    left = max(L, S) if left is None else left
    return (q_lo >= k_hi) & (q_hi - k_lo <= left), (q_hi >= k_lo) & (q_lo - k_hi <= left)


def block_mask_operands(block_mask, L, S):
    """(mask, band) for the BlockMask: mask the dense bool mask
    [Bm, Hm, L, S] (a view with padded row stride; full blocks True, empty
    False, partial blocks mask_mod) and band None, or mask None and band the
    left window (-1: none) of a causal mask when the BlockMask is exactly
    0 <= q_idx - kv_idx (<= left): its blocks are the band's and mask_mod
    agrees on every partial block."""
    if tuple(block_mask.seq_lengths) != (L, S):
        raise ValueError(f"fmha.torch.flex_attention: block_mask was made for sequence lengths "
                         f"{tuple(block_mask.seq_lengths)}, the inputs have ({L}, {S})")
    QB, KB = block_mask.BLOCK_SIZE
    nq, nk = -(-L // QB), -(-S // KB)
    if block_mask.kv_indices.shape[-2] < nq:
        raise ValueError(f"fmha.torch.flex_attention: block_mask has {block_mask.kv_indices.shape[-2]} query "
                         f"blocks of {QB}, {L} queries need {nq}")
    kv_num, kv_idx = block_mask.kv_num_blocks.cpu(), block_mask.kv_indices.cpu()
    partial = _block_grid(kv_num, kv_idx, max(nk, kv_idx.shape[-1]))[..., :nq, :nk]
    full = torch.zeros_like(partial)
    if block_mask.full_kv_num_blocks is not None:
        f_num, f_idx = block_mask.full_kv_num_blocks.cpu(), block_mask.full_kv_indices.cpu()
        full = _block_grid(f_num, f_idx, max(nk, f_idx.shape[-1]))[..., :nq, :nk]
    partial &= ~full
    Bm, Hm = partial.shape[0], partial.shape[1]
    where = partial.nonzero()
    b, h, qb, kb = where.unbind(1)
    # indices past the sequence are clamped (mask_mod may index by them);
    # their values fall in the padding
    q_idx = (qb[:, None] * QB + torch.arange(QB)).clamp_(max=L - 1)
    k_idx = (kb[:, None] * KB + torch.arange(KB)).clamp_(max=S - 1)
    values = (_evaluate_mask_mod(block_mask.mask_mod, b, h, q_idx, k_idx) if where.shape[0]
              else torch.zeros((0, QB, KB), dtype=torch.bool))
    # a band 0 <= q_idx - kv_idx <= left (causal: no left bound; a sliding
    # window: left the widest distance the partial blocks show) iff its full
    # blocks are the band's, every block the band touches is listed and the
    # partial blocks' values are the band's (PyTorch lists a block straddling
    # the sequence end as partial)
    distance = q_idx[:, :, None] - k_idx[:, None, :]
    for left in (None, int(distance[values].max()) if values.any() else None):
        band_full, band_touched = _band_blocks(nq, nk, QB, KB, L, S, left)
        in_band = (distance >= 0) if left is None else (distance >= 0) & (distance <= left)
        if (not (full & ~band_full).any() and not (band_touched & ~full & ~partial).any()
                and torch.equal(values, in_band)):
            return None, -1 if left is None else left
    # padded [Bm, Hm, nq * QB, nk * KB], seen as blocks [Bm, Hm, nq, nk, QB, KB]
    padded = torch.zeros((Bm, Hm, nq * QB, nk * KB), dtype=torch.bool)
    blocks = padded.view(Bm, Hm, nq, QB, nk, KB).permute(0, 1, 2, 4, 3, 5)
    blocks[full] = True
    if where.shape[0]:
        blocks[b, h, qb, kb] = values
    return padded[:, :, :L, :S], None


def dense_mask(block_mask, L, S):
    """The BlockMask as a dense bool mask [Bm, Hm, L, S] (None when it is
    exactly causal or a causal sliding window, which run natively)."""
    return block_mask_operands(block_mask, L, S)[0]


def _bias_options(fmha_bias, H):
    """(alibi [H] float32 or None, softcap) from fmha_bias."""
    if fmha_bias is None:
        return None, 0.0
    unknown = set(fmha_bias) - {"alibi_slopes", "softcap"}
    if unknown:
        raise ValueError(f"fmha.torch.flex_attention: fmha_bias takes alibi_slopes and softcap, got "
                         f"{sorted(unknown)}")
    alibi = fmha_bias.get("alibi_slopes")
    if alibi is not None:
        alibi = _float32_param(alibi, (H,), "alibi_slopes (one per query head)")
    return alibi, api.softcap_value(fmha_bias.get("softcap")) or 0.0


def _checked(query, key, value, enable_gqa):
    """(B, H, L, E, S) of query [B, H, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev]."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.device.type != "cpu":
            raise ValueError(f"fmha.torch.flex_attention: {name} must be a 4-D CPU tensor [B, H, L, E]")
        _dtype_code(t)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"fmha.torch.flex_attention: query, key and value must share a dtype, got {query.dtype}, "
                        f"{key.dtype}, {value.dtype}")
    B, H, L, E = query.shape
    _, Hkv, S, _ = key.shape
    if key.shape[0] != B or value.shape[0] != B or key.shape[3] != E or value.shape[1:3] != key.shape[1:3]:
        raise ValueError(f"fmha.torch.flex_attention: inconsistent shapes query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)}")
    if (Hkv != H and not enable_gqa) or H % Hkv != 0:
        raise ValueError(f"fmha.torch.flex_attention: query has {H} heads and key {Hkv}; grouped-query attention "
                         "needs enable_gqa=True and a multiple")
    return B, H, L, E, S


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, *, fmha_bias=None):
    """torch.nn.attention.flex_attention.flex_attention by fmha's C kernels,
    differentiable (query, key, value) on CPU.

    query [B, H, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev], float32,
    bfloat16 or float16. block_mask: a BlockMask from create_block_mask (B or
    H may be None there: the mask broadcasts, and mask_mod is evaluated at
    b = 0 or h = 0 only, so it must not depend on them), made for (L, S); it is turned
    into a dense bool mask [Bm, Hm, L, S] (L * S bytes per batch/head it
    spans) with mask_mod evaluated on its partial blocks only; one that is
    exactly causal or a causal sliding window runs as fmha's causal mask
    and window instead. score_mod
    must be None: an arbitrary score_mod raises NotImplementedError. The
    common ones come as fmha_bias=dict(alibi_slopes=[H] tensor, softcap=c):
    score = c * tanh(scale * q.k / c) - alibi_slopes[h] * |q_idx - kv_idx|.
    enable_gqa allows H % Hkv == 0. return_lse also returns the natural-log
    logsumexp [B, H, L] float32, as PyTorch's, detached (no gradient flows
    through it). alibi_slopes get a gradient when they require one. A row
    that sees no key gives O = 0 and lse = -inf.
    """
    if score_mod is not None:
        raise NotImplementedError("fmha.torch.flex_attention: an arbitrary score_mod is not supported; pass "
                                  "score_mod=None and fmha_bias=dict(alibi_slopes=..., softcap=...) for ALiBi "
                                  "and logit softcapping")
    B, H, L, E, S = _checked(query, key, value, enable_gqa)
    scale = api.resolve_scale(1.0 / math.sqrt(E) if scale is None else scale, E)
    mask, band = None, None
    if block_mask is not None:
        Bm, Hm = block_mask.kv_num_blocks.shape[:2]
        if Bm not in (1, B) or Hm not in (1, H):
            raise ValueError(f"fmha.torch.flex_attention: block_mask is for batch {Bm} and {Hm} heads; the inputs "
                             f"have batch {B} and {H} heads (B=None or H=None in create_block_mask broadcasts)")
        mask, band = block_mask_operands(block_mask, L, S)
    alibi, softcap = _bias_options(fmha_bias, H)
    refuse_forward_ad("fmha.torch.flex_attention", (query, key, value))
    out, lse = torch.ops.fmha.attention(*attention_args(
        query, key, value, mask=mask, alibi=alibi, causal=api.causal_code(band is not None, "top_left"),
        scale=float(scale), window=[-1 if band is None else band, -1], softcap=softcap, rel_options=[128, 1],
        precision=api.PRECISIONS["fast"], dropout_p=0.0, dropout_seed=0, dropout_offset=0))
    return (out, lse.detach()) if return_lse else out
