"""jax_ring_worker: one case of fmha.jax.ring_attention, run by
test_jax_ring.py in a fresh interpreter, since the 4 host devices
(XLA_FLAGS) must be set before JAX starts.

  python jax_ring_worker.py local CASE          4 devices in this process
  python jax_ring_worker.py distributed RANK PORT   one of 2 processes, 2 devices each

Each case checks the ring's output and its gradients of q, k, v (vjp with a
random cotangent) against single-device fmha.jax.dot_product_attention and
the float64 reference; it exits non-zero (AssertionError) on a mismatch.
"""

import os
import sys

MODE = sys.argv[1]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=" + ("4" if MODE == "local" else "2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import reference, rel_error, uniform  # noqa: E402

TOL = 2e-5
# name: (B, T, S, N, K, H, Hv, is_causal); T and S are the global lengths, split 4 ways
CASES = {
    "plain": (2, 16, 16, 4, 4, 8, 8, False),
    "causal": (2, 16, 16, 4, 4, 8, 8, True),
    "gqa": (1, 12, 20, 4, 2, 16, 8, False),        # T != S, Hv != H
    "gqa_causal": (2, 20, 20, 6, 2, 8, 8, True),
    "mqa_causal_scale": (1, 8, 8, 4, 1, 8, 8, True),
    "bf16_gqa_causal": (2, 16, 16, 4, 2, 16, 16, True),
}
# bf16: results rounded to bf16 (the merges and dK/dV sums run in float32); the bar of test_jax's bf16 test
BF16_TOL = 5e-2


def inputs(case):
    B, T, S, N, K, H, Hv, is_causal = CASES[case]
    rng = np.random.default_rng(len(case))
    q, k, v = uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, Hv))
    d_o = uniform(rng, (B, T, N, Hv))
    if case.startswith("bf16"):  # the reference sees the rounded inputs
        q, k, v, d_o = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, d_o))
    return q, k, v, d_o, is_causal


def output_and_grads(attend, q, k, v, d_o):
    out, vjp = jax.vjp(attend, q, k, v)
    return [out, *vjp(d_o)]


def check(case, mesh, put):
    import fmha.jax as fj

    q, k, v, d_o, is_causal = inputs(case)
    scale = 0.3 if "scale" in case else None
    spec = PartitionSpec(None, "sp")
    ring = jax.shard_map(lambda q, k, v: fj.ring_attention(q, k, v, axis_name="sp", is_causal=is_causal,
                                                            scale=scale),
                         mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    ours = jax.jit(lambda *a: output_and_grads(ring, *a[:3], a[3]))(*(put(x, spec) for x in (q, k, v, d_o)))
    ours = [np.asarray(jax.device_get(x)) if x.is_fully_addressable else gather(x) for x in ours]
    single = jax.jit(lambda *a: output_and_grads(
        lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=is_causal, scale=scale), *a[:3], a[3]))
    theirs = [np.asarray(x, np.float32) for x in single(q, k, v, d_o)]
    ref = reference(*(np.asarray(x, np.float32) for x in (q, k, v)), is_causal=is_causal, scale=scale,
                    d_out=np.asarray(d_o, np.float32))
    tol = BF16_TOL if case.startswith("bf16") else TOL
    for got, same, name in zip(ours, theirs, ("o", "dq", "dk", "dv")):
        assert got.dtype == q.dtype, (name, got.dtype)
        got = got.astype(np.float32)
        assert got.shape == same.shape, (name, got.shape, same.shape)
        assert rel_error(got, same) < tol, (case, name, rel_error(got, same))
        assert rel_error(got, ref[name]) < tol, (case, name, rel_error(got, ref[name]))


def gather(x):
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def main():
    if MODE == "local":
        assert jax.device_count() == 4, jax.devices()
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("sp",))
        check(sys.argv[2], mesh, lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec)))
        return
    rank, port = int(sys.argv[2]), int(sys.argv[3])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                               initialization_timeout=60)
    assert jax.device_count() == 4 and jax.local_device_count() == 2, jax.devices()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("sp",))

    def put(x, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    for case in ("plain", "gqa_causal"):
        check(case, mesh, put)
    jax.distributed.shutdown()
    print("distributed ring: 2 cases passed")


if __name__ == "__main__":
    main()
