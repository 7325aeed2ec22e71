"""test_torch_ring: fmha.torch.ring_attention over torch.distributed (gloo,
127.0.0.1, processes started by torch.multiprocessing.spawn on a free port):
each rank's output and its gradients of its query, key and value slices
against single-process fmha.torch.scaled_dot_product_attention over the
whole sequence and the float64 reference (relative error < 2e-5): plain,
causal, GQA with L != S and Ev != E, GQA causal on 2 and 3 ranks, a given
scale. Also the argument errors. Skipped when PyTorch is not installed,
unless FMHA_REQUIRE_TORCH=1."""

import os
import socket

import numpy as np
import pytest

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    torch = None

if torch is None and os.environ.get("FMHA_REQUIRE_TORCH") == "1":
    raise RuntimeError("FMHA_REQUIRE_TORCH=1 but PyTorch is not importable")
pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (FMHA_REQUIRE_TORCH=1 makes "
                                                      "this a failure)")

from conftest import reference, rel_error, uniform  # noqa: E402

TOL = 2e-5
# name: (world size, B, H, Hkv, L, S, E, Ev, is_causal, scale); L and S are the global lengths
CASES = {
    "plain": (2, 2, 4, 4, 16, 16, 8, 8, False, None),
    "causal": (2, 2, 4, 4, 16, 16, 8, 8, True, None),
    "gqa": (2, 1, 4, 2, 12, 20, 16, 8, False, None),
    "gqa_causal": (2, 2, 6, 2, 20, 20, 8, 8, True, 0.3),
    "gqa_causal_3_ranks": (3, 1, 4, 2, 21, 21, 8, 8, True, None),
}


def _inputs(case):
    _, B, H, Hkv, L, S, E, Ev, _, _ = CASES[case]
    rng = np.random.default_rng(len(case))
    # [B, L, H, E] as the reference takes them; the ranks see [B, H, L, E]
    return (uniform(rng, (B, L, H, E)), uniform(rng, (B, S, Hkv, E)), uniform(rng, (B, S, Hkv, Ev)),
            uniform(rng, (B, L, H, Ev)))


def _sdpa_layout(x):
    return torch.from_numpy(np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3))))


def _rank_slice(t, rank, world):
    n = t.shape[2] // world
    return t[:, :, rank * n:(rank + 1) * n]


def _worker(rank, world, port, case):
    import fmha.torch as FT

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        _, _, H, Hkv, _, _, _, _, is_causal, scale = CASES[case]
        q, k, v, d_o = _inputs(case)
        full = [_sdpa_layout(x) for x in (q, k, v, d_o)]
        mine = [_rank_slice(x, rank, world).clone().requires_grad_(i < 3) for i, x in enumerate(full)]
        out = FT.ring_attention(*mine[:3], is_causal=is_causal, scale=scale)
        out.backward(mine[3])
        ours = [out.detach()] + [x.grad for x in mine[:3]]

        whole = [x.clone().requires_grad_(True) for x in full[:3]]
        single = FT.scaled_dot_product_attention(*whole, is_causal=is_causal, scale=scale, enable_gqa=H != Hkv)
        single.backward(full[3])
        ref = reference(q, k, v, is_causal=is_causal, scale=scale, d_out=d_o)
        for got, same, name in zip(ours, [single.detach()] + [x.grad for x in whole], ("o", "dq", "dk", "dv")):
            same = _rank_slice(same, rank, world)
            exact = _rank_slice(_sdpa_layout(ref[name]), rank, world)
            assert got.shape == same.shape, (name, got.shape, same.shape)
            assert rel_error(got.numpy(), same.numpy()) < TOL, (case, rank, name)
            assert rel_error(got.numpy(), exact.numpy()) < TOL, (case, rank, name)
        if case == "gqa":
            try:
                FT.ring_attention(mine[0], mine[1][:, :, :1], mine[2][:, :, :1], is_causal=True)
            except ValueError as e:
                assert "equal query and key slices" in str(e), e
            else:
                raise AssertionError("unequal causal slices were accepted")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", list(CASES))
def test_ring_matches_single_process(case):
    world = CASES[case][0]
    mp.spawn(_worker, args=(world, _free_port(), case), nprocs=world, join=True)


def test_errors():
    import fmha.torch as FT

    x = torch.zeros(1, 2, 4, 8)
    if not (dist.is_available() and dist.is_initialized()):
        with pytest.raises(RuntimeError, match="initialized torch.distributed"):
            FT.ring_attention(x, x, x)
    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="4-D"):
            FT.ring_attention(x[0], x[0], x[0])
        with pytest.raises(ValueError, match="inconsistent shapes"):
            FT.ring_attention(x, torch.zeros(1, 3, 4, 8), torch.zeros(1, 3, 4, 8))
        with pytest.raises(ValueError, match="share a dtype"):
            FT.ring_attention(x, x.double(), x)
        with pytest.raises(ValueError, match="equal query and key slices"):
            FT.ring_attention(x, x[:, :, :2], x[:, :, :2], is_causal=True)
        # one rank: the ring is the plain call
        q, k, v = (torch.from_numpy(uniform(np.random.default_rng(i), (1, 2, 4, 8))) for i in range(3))
        assert rel_error(FT.ring_attention(q, k, v, is_causal=True).numpy(),
                         FT.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()) < TOL
    finally:
        dist.destroy_process_group()
