"""test_torch_ring: fmha.torch.ring_attention over torch.distributed (gloo,
127.0.0.1, processes started by torch.multiprocessing.spawn on a free port):
each rank's output and its gradients of its query, key and value slices
against single-process fmha.torch.scaled_dot_product_attention over the
whole sequence and the float64 reference (relative error < 2e-5): plain,
causal, GQA with L != S and Ev != E, GQA causal on 2 and 3 ranks, a given
scale. The cases of one world size share one spawn of their ranks (a
rank's start, importing torch, is most of its time); each case still
passes or fails on its own. Also the argument errors. Skipped when PyTorch
is not installed, unless FMHA_REQUIRE_TORCH=1."""

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


def _check_case(rank, world, case):
    import fmha.torch as FT

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


def _worker(rank, world, port, cases, out_dir):
    """Every case of this world size in one process group (one process start
    per rank: importing torch is most of a rank's time); each case's failure
    on this rank is written to out_dir/<case>.<rank> and the next case runs."""
    import traceback

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for case in cases:
            try:
                _check_case(rank, world, case)
            except Exception:
                with open(os.path.join(out_dir, f"{case}.{rank}"), "w") as f:
                    f.write(traceback.format_exc())
                raise  # a rank that stops leaves the others' collectives waiting: end the group
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ring_failures(tmp_path_factory):
    """case -> the failures its ranks wrote (empty when it passed), the cases
    of each world size run by one spawn of that many processes."""
    out_dir = str(tmp_path_factory.mktemp("ring"))
    spawn_errors = {}
    for world in sorted({c[0] for c in CASES.values()}):
        cases = [name for name, c in CASES.items() if c[0] == world]
        try:
            mp.spawn(_worker, args=(world, _free_port(), cases, out_dir), nprocs=world, join=True)
        except Exception as e:  # a rank failed: its case wrote the cause; later cases did not run
            for case in cases:
                spawn_errors[case] = f"the {world}-rank group stopped: {e}"
    failures = {}
    for case in CASES:
        written = [open(os.path.join(out_dir, name)).read() for name in sorted(os.listdir(out_dir))
                   if name.rsplit(".", 1)[0] == case]
        failures[case] = written or ([spawn_errors[case]] if case in spawn_errors else [])
    return failures


@pytest.mark.parametrize("case", list(CASES))
def test_ring_matches_single_process(case, ring_failures):
    assert not ring_failures[case], "\n".join(ring_failures[case])


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
