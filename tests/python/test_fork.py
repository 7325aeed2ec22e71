"""test_fork: the bindings in processes forked after a multithreaded call.
The C pool's workers do not survive fork(); children must get a fresh pool
instead of waiting forever. Each scenario runs in a fresh interpreter (no
JAX threads around the fork, and a hang becomes a timeout, not a stuck
test run):

  - os.fork after a 4-thread call: the child and the parent compute again;
  - a multiprocessing pool with the fork start method (3 workers);
  - a torch DataLoader with 2 fork workers (skipped without PyTorch).

Every result in a child is bitwise equal to the parent's (results do not
depend on the thread count), and the parent's O matches the float64
reference in conftest within 1e-5 + 1e-4 |r| per element.
"""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import reference

TIMEOUT = 120

# Shared by every scenario: seeded inputs, one call, a result compared bitwise.
PRELUDE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import fmha

    def inputs(seed):
        rng = np.random.default_rng(seed)
        q = rng.uniform(-1, 1, (2, 70, 4, 32)).astype(np.float32)
        k = rng.uniform(-1, 1, (2, 90, 2, 32)).astype(np.float32)
        v = rng.uniform(-1, 1, (2, 90, 2, 16)).astype(np.float32)
        return q, k, v

    def compute(seed):
        q, k, v = inputs(seed)
        o, lse = fmha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                return_lse=True, strategy="tiled")
        dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, o, is_causal=True,
                                             causal_alignment="bottom_right", strategy="tiled")
        return [o, lse, dq, dk, dv]

    def same(a, b):
        return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))

    fmha.set_num_threads(4)
    expected = {s: compute(s) for s in range(3)}
""")

SCENARIOS = {
    "os_fork": """
        pid = os.fork()
        if pid == 0:
            os._exit(0 if all(same(compute(s), expected[s]) for s in range(3)) else 1)
        parent_ok = all(same(compute(s), expected[s]) for s in range(3))
        _, status = os.waitpid(pid, 0)
        assert parent_ok, "the parent's results changed after the fork"
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
        print("ok")
    """,
    "multiprocessing": """
        import multiprocessing as mp

        def work(seed):
            return same(compute(seed), expected[seed])

        with mp.get_context("fork").Pool(3) as pool:
            results = pool.map(work, [0, 1, 2, 0, 1, 2])
        assert all(results), f"children disagree: {results}"
        assert all(same(compute(s), expected[s]) for s in range(3))
        print("ok")
    """,
    "torch_dataloader": """
        import torch
        from torch.utils.data import DataLoader, Dataset

        class Attention(Dataset):
            def __len__(self):
                return 6

            def __getitem__(self, i):
                return int(same(compute(i % 3), expected[i % 3]))

        loader = DataLoader(Attention(), batch_size=1, num_workers=2,
                            multiprocessing_context="fork")
        results = [int(b) for b in loader]
        assert results == [1] * 6, f"workers disagree: {results}"
        print("ok")
    """,
}


def run_scenario(name):
    code = PRELUDE + textwrap.dedent(SCENARIOS[name])
    # its own session, so that a hung scenario is killed with its children
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{name}: no answer after {TIMEOUT} s (a forked child waits for the parent's pool?)")
    assert proc.returncode == 0 and out.strip().endswith("ok"), (
        f"{name}: exit {proc.returncode}\n{out}\n{err}")


def test_parent_matches_reference():
    import fmha

    rng = np.random.default_rng(0)
    q = rng.uniform(-1, 1, (2, 70, 4, 32)).astype(np.float32)
    k = rng.uniform(-1, 1, (2, 90, 2, 32)).astype(np.float32)
    v = rng.uniform(-1, 1, (2, 90, 2, 16)).astype(np.float32)
    o = fmha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right", strategy="tiled")
    r = reference(q, k, v, is_causal=True, causal_alignment="bottom_right")["o"]
    assert np.all(np.abs(o - r) <= 1e-5 + 1e-4 * np.abs(r))


def test_os_fork():
    run_scenario("os_fork")


def test_multiprocessing_fork_pool():
    run_scenario("multiprocessing")


def test_torch_dataloader_fork_workers():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed: the DataLoader scenario needs it")
    run_scenario("torch_dataloader")
