"""smoke.py: checks an installed fmha package from outside the source tree
(tests/install/run.sh runs it in a throwaway virtualenv, from a temporary
working directory, with a PATH that holds no compiler and an empty cache).

It checks that the package, its libfmha.so and its JAX FFI handler are the
installed ones, that the version is the same everywhere, and runs NumPy,
JAX (jit and grad) and, when torch is importable, PyTorch once each against
a float64 reference; then that the tools (fmha.tools) are there. One line per step; exit status 1 on the first failure.

  usage: python smoke.py --source-tree DIR [--require-jax]
"""

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys

import numpy as np


def step(name, detail=""):
    print(f"smoke: {name:<8} ok  {detail}".rstrip(), flush=True)


def fail(msg):
    print(f"smoke: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def reference(q, k, v, causal=False):
    """softmax(Q K^T / sqrt(H)) V in float64, [B, T, N, H] arrays."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnh->btnh", p, v)


def inside(path, root):
    return os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) == os.path.realpath(root)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-tree", required=True, help="the repository, which must not be imported")
    ap.add_argument("--require-jax", action="store_true")
    args = ap.parse_args()

    import fmha
    from fmha import _lib

    pkg = os.path.dirname(os.path.abspath(fmha.__file__))
    if inside(pkg, args.source_tree):
        fail(f"fmha imported from the source tree ({pkg}), not from the installed package")
    if os.environ.get("FMHA_LIBRARY"):
        fail("FMHA_LIBRARY is set; the package must find its library alone")
    lib = _lib.library_path()
    if os.path.dirname(lib) != pkg:
        fail(f"libfmha loaded from {lib}, not from the package {pkg}")
    versions = {fmha.__version__, fmha.version_string(), importlib.metadata.version("fmha")}
    if len(versions) != 1:
        fail(f"versions differ: package {fmha.__version__}, library {fmha.version_string()}, "
             f"metadata {importlib.metadata.version('fmha')}")
    step("import", f"fmha {fmha.__version__} from {pkg}, ISA {fmha.isa_name()}")

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 33, 4, 16)).astype(np.float32) for _ in range(3))
    err = np.abs(fmha.attention(q, k, v, is_causal=True) - reference(q, k, v, True)).max()
    if not err < 1e-4:
        fail(f"NumPy attention: max error {err}")
    step("numpy", f"max error {err:.1e}")

    # bf16 and f16 forward and backward: on AMX CPUs bf16 runs on the tiles
    # (a Release library whose tile configuration the optimiser had emptied
    # died here with SIGILL)
    if importlib.util.find_spec("ml_dtypes") is None:
        step("lowp", "skipped (ml_dtypes not installed)")
    else:
        import ml_dtypes

        worst = {}
        for name, dt in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
            ql, kl, vl = (rng.standard_normal((1, 200, 4, 64)).astype(dt) for _ in range(3))
            dol = rng.standard_normal((1, 200, 4, 64)).astype(dt)
            o, lse = fmha.attention(ql, kl, vl, is_causal=True, return_lse=True)
            dq, dk, dv = fmha.attention_backward(ql, kl, vl, o, lse, dol, is_causal=True)
            q64, k64, v64, do64 = (x.astype(np.float64) for x in (ql, kl, vl, dol))
            o_ref = reference(q64, k64, v64, True)
            # gradients of sum(O * dO) by central differences would be slow: check dV = P^T dO
            s = np.einsum("btnh,bsnh->bnts", q64, k64) / 8.0
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
            pr = np.exp(s - s.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            dv_ref = np.einsum("bnts,btnh->bsnh", pr, do64)
            rel = max(np.abs(o.astype(np.float64) - o_ref).max() / np.abs(o_ref).max(),
                      np.abs(dv.astype(np.float64) - dv_ref).max() / np.abs(dv_ref).max())
            if not (rel < 2e-2 and np.isfinite(dq.astype(np.float64)).all() and np.isfinite(dk.astype(np.float64)).all()):
                fail(f"{name} attention: relative error {rel} (O, dV), or a non-finite dQ/dK")
            worst[name] = rel
        step("lowp", ", ".join(f"{n} fwd+bwd rel error {e:.1e}" for n, e in worst.items()) + f", ISA {fmha.isa_name()}")

    if importlib.util.find_spec("jax") is None:
        if args.require_jax:
            fail("jax is not installed")
        step("jax", "skipped (jax not installed)")
    else:
        for cc in ("c++", "g++", "clang++", "cc", "gcc"):
            if shutil.which(cc):
                fail(f"a compiler is on PATH ({shutil.which(cc)}); the JAX check needs a PATH without one")
        import jax
        import jax.numpy as jnp
        import fmha.jax as fj

        f = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True))
        out = np.asarray(f(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)))
        err = np.abs(out - reference(q, k, v, True)).max()
        if not err < 1e-4:
            fail(f"JAX attention: max error {err}")
        g = jax.grad(lambda q: fj.dot_product_attention(q, k, v).sum())(jnp.asarray(q))
        g_ref = jax.grad(lambda q: jax.nn.dot_product_attention(q, k, v).sum())(jnp.asarray(q))
        gerr = float(jnp.abs(g - g_ref).max())
        if not gerr < 1e-3:
            fail(f"JAX gradient: max error {gerr}")
        handler = fj.ffi_library_path()
        if os.path.dirname(os.path.dirname(handler)) != pkg:
            fail(f"the JAX FFI handler {handler} is not the one shipped in the package")
        step("jax", f"jit + grad, max errors {err:.1e} / {gerr:.1e}, handler {os.path.relpath(handler, pkg)}")

    if importlib.util.find_spec("torch") is None:
        step("torch", "skipped (torch not installed)")
    else:
        import torch
        import fmha.torch as ft

        tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))  # [B, N, T, H]
        out = ft.scaled_dot_product_attention(tq, tk, tv, is_causal=True).transpose(1, 2).numpy()
        err = np.abs(out - reference(q, k, v, True)).max()
        if not err < 1e-4:
            fail(f"PyTorch attention: max error {err}")
        step("torch", f"max error {err:.1e}")

    # the tools' subpackage is in the wheel, and the former module name runs it
    import subprocess

    if importlib.util.find_spec("fmha.tools.report") is None:
        fail("fmha.tools.report is missing from the package")
    proc = subprocess.run([sys.executable, "-m", "fmha.bench_peers", "--help"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.startswith("usage: python -m fmha.tools.bench_peers"):
        fail(f"python -m fmha.bench_peers --help: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    step("tools", "fmha.tools.report, fmha.tools.bench_peers (and python -m fmha.bench_peers)")


if __name__ == "__main__":
    main()
