"""test_jax_ring: fmha.jax.ring_attention under jax.shard_map, output and
gradients of q, k, v against single-device fmha.jax.dot_product_attention
and the float64 reference (relative error < 2e-5): plain, causal, GQA/MQA,
T != S, a given scale, bf16 (relative error < 5e-2); on 4 host devices in one process, and on 2 processes
of 2 devices each joined by jax.distributed (gloo CPU collectives,
127.0.0.1). Each run is a fresh interpreter (jax_ring_worker.py): the device
count must be set before JAX starts. Also the argument errors."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import fmha.jax as fj  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_ring_worker.py")
TIMEOUT = 300
CASES = ["plain", "causal", "gqa", "gqa_causal", "mqa_causal_scale", "bf16_gqa_causal"]


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(fj.__file__))] +
                                      [p for p in [e.get("PYTHONPATH")] if p])
    return e


@pytest.mark.parametrize("case", CASES)
def test_four_local_devices(case):
    run = subprocess.run([sys.executable, WORKER, "local", case], env=env(), capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stdout + run.stderr


def test_two_processes_jax_distributed():
    if not hasattr(jax.config, "jax_cpu_collectives_implementation"):
        pytest.skip("this jax has no jax_cpu_collectives_implementation option (CPU collectives across processes)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, WORKER, "distributed", str(rank), str(port)], env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "2 cases passed" in out, out


def test_errors():
    x = np.zeros((1, 8, 2, 8), np.float32)
    with pytest.raises(ValueError, match="4-D"):
        fj.ring_attention(x[0], x[0], x[0], axis_name="sp")
    with pytest.raises(ValueError, match="value shape"):
        fj.ring_attention(x, x, x[:, :4], axis_name="sp")
    with pytest.raises(ValueError, match="query shape"):
        fj.ring_attention(np.zeros((1, 8, 3, 8), np.float32), x, x, axis_name="sp")
    with pytest.raises(ValueError, match="share a dtype"):
        fj.ring_attention(x.astype(np.float16), x, x, axis_name="sp")
    with pytest.raises(ValueError, match="equal query and key slices"):
        fj.ring_attention(x[:, :4], x, x, axis_name="sp", is_causal=True)
