"""binding_overhead.py: the per-call cost fmha.jax (jitted) and fmha.torch add
to the C library, measured in one process on the same inputs.

For each (seq, mode) it times three callers of the same work, one call of
each in turn:
  c      fmha_plan_forward (+ fmha_plan_backward for fwdbwd) through ctypes
         on one reused plan: the C time (lse written, as the bindings do)
  c+alloc  the same with outputs allocated per call (np.empty), as a
         framework's are: what fresh, cold output memory costs
  jax    jax.jit of fmha.jax.dot_product_attention (fwdbwd: its jax.vjp)
  c-bhsd   the C call on the same inputs as [B, H, S, D] (what fmha.torch
         passes the library: torch's SDPA takes [B, H, S, D]); torch-c is
         measured against it
  torch  fmha.torch.scaled_dot_product_attention (fwdbwd: autograd.grad)
and prints a low quantile (default 0.2) of each caller's per-call times in
us, which a busy machine disturbs least, and the bindings' overhead
(binding minus C). Inputs: [B, S, H, D] float32 uniform in [-1, 1).

    FMHA_LIBRARY=build/libfmha.so PYTHONPATH=python \
        .venv/bin/python tools/binding_overhead.py --bindings torch --threads 1

Time one binding per process: after a JAX call XLA's worker threads keep
spinning for a while, which slows whatever runs next on a small machine.
"""

import argparse
import ctypes
import time
import weakref

import numpy as np


def c_runner(lib_mod, q, k, v, d_o, fwdbwd, fresh=False, bhsd=False):
    lib = lib_mod.load()
    B, S, H, D = q.shape
    if bhsd:  # the inputs as [B, H, S, D], the layout of torch's SDPA convention
        q, k, v, d_o = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v, d_o))
    p = lib_mod.problem_init(B, H, H, S, S, D, D, lib_mod.LAYOUT_BHSD if bhsd else lib_mod.LAYOUT_BSHD)
    plan = ctypes.c_void_p()
    # Own function objects (lib[name]), so the prototypes of fmha._lib stay as they are.
    create = lib["fmha_plan_create"]
    create.restype, create.argtypes = ctypes.c_int, [ctypes.POINTER(lib_mod.fmha_problem),
                                                     ctypes.POINTER(ctypes.c_void_p)]
    lib_mod.check(create(ctypes.byref(p), ctypes.byref(plan)), "fmha_plan_create")
    fwd, bwd = lib["fmha_plan_forward"], lib["fmha_plan_backward"]
    fwd.restype = bwd.restype = ctypes.c_int
    fwd.argtypes = [ctypes.c_void_p] * 6
    bwd.argtypes = [ctypes.c_void_p] * 11
    o, dq, dk, dv = (np.empty_like(x) for x in (q, q, k, v))
    lse = np.empty((B, H, S), np.float32)
    a = [x.ctypes.data for x in (q, k, v, o, lse, d_o, dq, dk, dv)]
    fwd_args = (plan.value, a[0], a[1], a[2], a[3], a[4])
    bwd_args = (plan.value, a[0], a[1], a[2], a[3], a[5], a[4], a[6], a[7], a[8], None)

    keep = (p, plan, q, k, v, d_o, o, lse, dq, dk, dv)  # alive as long as run is

    def run(keep=keep):
        st = fwd(*fwd_args)
        if fwdbwd and st == 0:
            st = bwd(*bwd_args)
        if st != 0:
            lib_mod.check(st, "fmha_plan")

    def run_fresh(keep=keep):
        # outputs allocated per call, as a framework's are
        o, lse = np.empty_like(q), np.empty((B, H, S), np.float32)
        st = fwd(plan.value, a[0], a[1], a[2], o.ctypes.data, lse.ctypes.data)
        if fwdbwd and st == 0:
            dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
            st = bwd(plan.value, a[0], a[1], a[2], o.ctypes.data, a[5], lse.ctypes.data, dq.ctypes.data,
                     dk.ctypes.data, dv.ctypes.data, None)
        if st != 0:
            lib_mod.check(st, "fmha_plan")

    chosen = run_fresh if fresh else run
    destroy = lib["fmha_plan_destroy"]
    destroy.restype, destroy.argtypes = None, [ctypes.c_void_p]
    weakref.finalize(chosen, destroy, plan.value)
    return chosen


def jax_runner(q, k, v, d_o, fwdbwd):
    import jax

    import fmha.jax as fj

    args = [jax.numpy.asarray(x) for x in (q, k, v)]
    g = jax.numpy.asarray(d_o)

    def forward(q, k, v):
        return fj.dot_product_attention(q, k, v)

    if fwdbwd:
        fn = jax.jit(lambda q, k, v, g: jax.vjp(forward, q, k, v)[1](g))
        args.append(g)
    else:
        fn = jax.jit(forward)
    jax.block_until_ready(fn(*args))

    def run():
        jax.block_until_ready(fn(*args))

    return run


def torch_runner(q, k, v, d_o, fwdbwd):
    import torch

    import fmha.torch as ft

    to = [torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3))) for x in (q, k, v, d_o)]
    tq, tk, tv, tg = to
    if fwdbwd:
        for t in (tq, tk, tv):
            t.requires_grad_(True)

        def run():
            out = ft.scaled_dot_product_attention(tq, tk, tv)
            torch.autograd.grad(out, (tq, tk, tv), tg)
    else:
        def run():
            with torch.no_grad():
                ft.scaled_dot_product_attention(tq, tk, tv)
    run()
    return run


def sample(runners, seconds):
    """Per-call times (us) of each runner, one call of each in turn until
    `seconds` have passed, so that load on the machine hits them alike."""
    times = {name: [] for name in runners}
    clock = time.perf_counter
    end = clock() + seconds
    while clock() < end:
        for name, run in runners.items():
            t0 = clock()
            run()
            times[name].append((clock() - t0) * 1e6)
    return times


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="64,128,256")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="fmha and torch threads (0: their defaults)")
    ap.add_argument("--seconds", type=float, default=3.0, help="sampling time per row")
    ap.add_argument("--quantile", type=float, default=0.2,
                    help="of the per-call times reported (low: the calls the machine's load spared)")
    ap.add_argument("--bindings", default="jax,torch")
    args = ap.parse_args()

    from fmha import _lib

    if args.threads:
        _lib.set_num_threads(args.threads)
    bindings = [b for b in args.bindings.split(",") if b]
    if "torch" in bindings:
        try:
            import torch

            if args.threads:
                torch.set_num_threads(args.threads)
        except ImportError:
            print("torch: not installed, skipped")
            bindings.remove("torch")
    makers = {"jax": jax_runner, "torch": torch_runner}
    rng = np.random.default_rng(0)
    print(f"B={args.batch} H={args.heads} D={args.dim} float32 threads={_lib.get_num_threads()}; "
          f"us per call, quantile {args.quantile} of each caller's calls")
    print(f"{'mode':7s} {'seq':>5s} {'c':>10s} {'c+alloc':>10s}" + (f" {'c-bhsd':>10s}" if "torch" in bindings else "") +
          "".join(f" {b:>10s} {b + '-c':>9s}" for b in bindings))
    for mode in args.modes.split(","):
        for S in (int(s) for s in args.seqs.split(",")):
            q, k, v, d_o = (rng.uniform(-1, 1, (args.batch, S, args.heads, args.dim)).astype(np.float32)
                            for _ in range(4))
            fwdbwd = mode == "fwdbwd"
            runners = {"c": c_runner(_lib, q, k, v, d_o, fwdbwd),
                       "c+alloc": c_runner(_lib, q, k, v, d_o, fwdbwd, fresh=True)}
            if "torch" in bindings:
                runners["c-bhsd"] = c_runner(_lib, q, k, v, d_o, fwdbwd, bhsd=True)
            for b in bindings:
                runners[b] = makers[b](q, k, v, d_o, fwdbwd)
            sample(runners, 0.2)  # warm up
            times = sample(runners, args.seconds)
            med = {name: quantile(ts, args.quantile) for name, ts in times.items()}
            line = f"{mode:7s} {S:5d} {med['c']:10.1f} {med['c+alloc']:10.1f}"
            if "torch" in bindings:
                line += f" {med['c-bhsd']:10.1f}"
            for b in bindings:
                line += f" {med[b]:10.1f} {med[b] - med['c-bhsd' if b == 'torch' else 'c']:9.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
