"""fmha.torch.flex_attention: torch.nn.attention.flex_attention's signature
with PyTorch's own BlockMask, served by fmha's C kernels on CPU, forward and
backward.

The BlockMask becomes one dense boolean mask [Bm, Hm, L, S] (Bm, Hm: the
BlockMask's batch and head sizes, 1 when it broadcasts), built once per call:
full blocks True, empty blocks False, and mask_mod evaluated (vectorised)
on the partial blocks only. It costs L * S bytes per (Bm, Hm). fmha
classifies each of its own tiles against that mask, so tiles the BlockMask
leaves empty are skipped and full ones run unmasked. A BlockMask that is
exactly causal (q_idx >= kv_idx, checked on its blocks and the partial
blocks' values) runs as fmha's causal mask, with no dense mask.

score_mod: only None; the common score modifications come as fmha_bias
(ALiBi slopes, logit softcap), run natively. Imported through fmha.torch,
whose ops and plan cache it uses.
"""

import math
from typing import Optional

import torch

from . import api
from .torch import _backward_operands, _checked_inputs, _forward, _outputs, _plan, _setup_context

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


def _causal_blocks(nq, nk, QB, KB, L, S):
    """(full, touched) [nq, nk] bool of the causal mask q_idx >= kv_idx:
    blocks it leaves all visible, blocks it leaves some key visible in."""
    q_lo = torch.arange(nq)[:, None] * QB
    q_hi = torch.clamp(q_lo + QB, max=L) - 1
    k_lo = torch.arange(nk)[None, :] * KB
    k_hi = torch.clamp(k_lo + KB, max=S) - 1
    return q_lo >= k_hi, q_hi >= k_lo


def block_mask_operands(block_mask, L, S):
    """(mask, is_causal) for the BlockMask: mask the dense bool mask
    [Bm, Hm, L, S] (a view with padded row stride; full blocks True, empty
    False, partial blocks mask_mod), or None with is_causal True when the
    BlockMask is exactly q_idx >= kv_idx: its full, partial and empty blocks
    are causal's and mask_mod agrees on every partial block."""
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
    # causal iff its full blocks are causal's, every block causal touches is
    # listed and the partial blocks' values are q_idx >= kv_idx (PyTorch
    # lists a block straddling the sequence end as partial)
    causal_full, causal_touched = _causal_blocks(nq, nk, QB, KB, L, S)
    if (not (full & ~causal_full).any() and not (causal_touched & ~full & ~partial).any()
            and torch.equal(values, q_idx[:, :, None] >= k_idx[:, None, :])):
        return None, True
    # padded [Bm, Hm, nq * QB, nk * KB], seen as blocks [Bm, Hm, nq, nk, QB, KB]
    padded = torch.zeros((Bm, Hm, nq * QB, nk * KB), dtype=torch.bool)
    blocks = padded.view(Bm, Hm, nq, QB, nk, KB).permute(0, 1, 2, 4, 3, 5)
    blocks[full] = True
    if where.shape[0]:
        blocks[b, h, qb, kb] = values
    return padded[:, :, :L, :S], False


def dense_mask(block_mask, L, S):
    """The BlockMask as a dense bool mask [Bm, Hm, L, S] (None when it is
    exactly causal, which runs as fmha's causal mask)."""
    return block_mask_operands(block_mask, L, S)[0]


@torch.library.custom_op("fmha::block_masked_attention", mutates_args=(), device_types="cpu")
def _flex_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
             alibi: Optional[torch.Tensor], is_causal: bool, softcap: float,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, None, mask, is_causal, scale, alibi, softcap)


@_flex_op.register_fake
def _flex_fake(q, k, v, mask, alibi, is_causal, softcap, scale):
    return _outputs(q, v)


@torch.library.custom_op("fmha::block_masked_attention_backward", mutates_args=(), device_types="cpu")
def _flex_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                      d_o: torch.Tensor, mask: Optional[torch.Tensor], alibi: Optional[torch.Tensor],
                      is_causal: bool, softcap: float,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o, lse, d_o, (dq, dk, dv) = _backward_operands(q, k, v, o, lse, d_o)
    plan = _plan(q, k, v, o, None, mask, is_causal, scale, alibi, softcap)
    plan.backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), d_o.data_ptr(), lse.data_ptr(),
                  dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None)
    return dq, dk, dv


@_flex_backward_op.register_fake
def _flex_backward_fake(q, k, v, o, lse, d_o, mask, alibi, is_causal, softcap, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _backward(ctx, d_o, d_lse):
    q, k, v, mask, alibi, o, lse = ctx.saved_tensors
    is_causal, softcap, scale = ctx.options
    if d_lse is not None and bool((d_lse != 0).any()):
        raise NotImplementedError("fmha.torch.flex_attention: gradients through the returned lse are not "
                                  "supported")
    dq, dk, dv = torch.ops.fmha.block_masked_attention_backward(q, k, v, o, lse, d_o, mask, alibi,
                                                                is_causal, softcap, scale)
    return dq, dk, dv, None, None, None, None, None


_flex_op.register_autograd(_backward, setup_context=_setup_context)


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
        alibi = torch.as_tensor(alibi).detach().to(device="cpu", dtype=torch.float32).contiguous()
        if tuple(alibi.shape) != (H,):
            raise ValueError(f"fmha.torch.flex_attention: alibi_slopes must have shape ({H},) (one per query "
                             f"head), got {tuple(alibi.shape)}")
    softcap = fmha_bias.get("softcap")
    softcap = 0.0 if softcap is None else float(softcap)
    if softcap != 0.0 and not (softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"fmha.torch.flex_attention: softcap must be positive and finite, got {softcap}")
    return alibi, softcap


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
    exactly causal runs as fmha's causal mask instead. score_mod
    must be None: an arbitrary score_mod raises NotImplementedError. The
    common ones come as fmha_bias=dict(alibi_slopes=[H] tensor, softcap=c):
    score = c * tanh(scale * q.k / c) - alibi_slopes[h] * |q_idx - kv_idx|.
    enable_gqa allows H % Hkv == 0. return_lse also returns the natural-log
    logsumexp [B, H, L] float32, as PyTorch's (not differentiable). A row
    that sees no key gives O = 0 and lse = -inf.
    """
    if score_mod is not None:
        raise NotImplementedError("fmha.torch.flex_attention: an arbitrary score_mod is not supported; pass "
                                  "score_mod=None and fmha_bias=dict(alibi_slopes=..., softcap=...) for ALiBi "
                                  "and logit softcapping")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        raise ValueError("fmha.torch.flex_attention: query, key and value must be 4-D tensors [B, H, L, E]")
    q, k, v, _ = _checked_inputs(query, key, value, enable_gqa)
    B, H, L, E = q.shape
    S = k.shape[2]
    scale = api.resolve_scale(1.0 / math.sqrt(E) if scale is None else scale, E)
    mask, is_causal = None, False
    if block_mask is not None:
        Bm, Hm = block_mask.kv_num_blocks.shape[:2]
        if Bm not in (1, B) or Hm not in (1, H):
            raise ValueError(f"fmha.torch.flex_attention: block_mask is for batch {Bm} and {Hm} heads; the inputs "
                             f"have batch {B} and {H} heads (B=None or H=None in create_block_mask broadcasts)")
        mask, is_causal = block_mask_operands(block_mask, L, S)
    alibi, softcap = _bias_options(fmha_bias, H)
    out, lse = torch.ops.fmha.block_masked_attention(q, k, v, mask, alibi, is_causal, softcap, float(scale))
    return (out, lse) if return_lse else out
