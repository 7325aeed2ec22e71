"""fmha.tools.bench_peers: times attention in JAX and PyTorch beside fmha's own
bindings, with fmha-bench's flags, inputs, timing rules and row schema, and
adds the rows to fmha-bench's results file.

    python -m fmha.tools.bench_peers --seqs 512,1024 --threads 2 --out results.json --append
    (python -m fmha.bench_peers runs it too)

Impls:
  jax_xla     jit of jax.nn.dot_product_attention(implementation='xla')
  torch_sdpa  torch.nn.functional.scaled_dot_product_attention on CPU
  openvino_sdpa
              OpenVINO's opset13 scaled_dot_product_attention compiled for its
              CPU plugin, the row's dtype as INFERENCE_PRECISION_HINT (bf16
              rows: bf16 inputs, bf16 inference) and INFERENCE_NUM_THREADS
              the --threads; forward only (fwdbwd rows are "unavailable")
  fmha_jax    fmha.jax.dot_product_attention (XLA FFI custom calls)
  fmha_torch  fmha.torch.scaled_dot_product_attention (torch.library op)
  fmha_jax_native, fmha_torch_native
              the same bindings given fmha's own keywords instead of dense
              tensors: masked_bias as key_value_seq_lengths and a learnable
              rel_table, causal with Sq != S as causal_alignment='bottom_right'
The fmha rows run the C kernels, so their distance to fmha-bench's own rows
is the binding overhead (the dense rows also pay for the [Sq, S] tensors).

Inputs are fmha-bench's: the same splitmix64 stream (seed 0x5eed5eed)
gives q, dO [B, Sq, H, D] and k, v [B, S, Hkv, D] uniform in [-1, 1) (torch
gets [B, H, S, D] copies); Sq (--seq-q, e.g. 1 for decoding) defaults to S
and Hkv (--heads-kv, GQA) to H. Variants: plain, causal (bottom-right, as
fmha-bench: top-left's mask when Sq = S; when Sq differs every impl gets it
as a boolean [Sq, S] mask, since the peers' is_causal is top-left), masked_bias: key
lengths S - S/8 for every batch element and a learnable T5 relative-position
table [H, 32] float32 (bidirectional, max distance 128; its values are the
stream's next H*32 draws), decode: one causal step of Sq (default 1) queries
against a cache of S keys. Every impl receives masked_bias as dense tensors,
a [B, 1, S, S] boolean mask and a [1, H, S, S] bias gathered from the table
inside the timed function, so in fwdbwd the table's gradient is part of the
work (torch gets one additive [B, H, S, S] mask: the bias with -inf where
the boolean mask hides a key).

Timing: calls per sample calibrated until a sample lasts >= 20 ms, then >= 7
samples; median, q1, q3 in ms per call. rel_err: against a float64 NumPy
reference, of O (fwd) or of dQ, dK, dV concatenated (fwdbwd). --threads N
pins every runtime to N threads: the process is bound to N CPUs and XLA_FLAGS
(--xla_cpu_multi_thread_eigen, intra_op_parallelism_threads) and the OpenMP
pools are set before JAX and PyTorch are imported; then torch.set_num_threads
and fmha_set_num_threads. A peer
that cannot be imported gives rows with "status": "unavailable".

The terminal table is fmha-bench's: median, q1..q3 and spread ((q3 - q1) /
median, marked '!' past 25%) per row; the progress line on stderr gives the
elapsed time and an estimate of the time left. The defaults (grid, variants
plain, modes fwd,fwdbwd) are fmha-bench's.

Exit status: 0 done, 1 the results file could not be read or written, 2 a
bad command line.
"""

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time

import numpy as np

IMPLS = ("jax_xla", "torch_sdpa", "openvino_sdpa", "fmha_jax", "fmha_torch", "fmha_jax_native", "fmha_torch_native")
DTYPES = ("float32", "bfloat16", "float16")
VARIANTS = ("plain", "causal", "masked_bias", "decode")
CAUSAL_VARIANTS = ("causal", "decode")  # decode: one causal step, Sq (default 1) against S cached keys
MODES = ("fwd", "fwdbwd")
INPUT_SEED = 0x5EED5EED
MAX_INNER = 1 << 24
MB = 1024.0 * 1024.0
REL_BUCKETS, REL_MAX_DISTANCE = 32, 128


# ---- command line ---------------------------------------------------------------------

def _int_list(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a comma-separated list of integers, got '{text}'") from None
    if any(v < 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"wants distinct integers >= 1, got '{text}'")
    return values


def _name_list(allowed):
    def parse(text):
        names = text.split(",")
        for n in names:
            if n not in allowed:
                raise argparse.ArgumentTypeError(f"unknown value '{n}' (known: {','.join(allowed)})")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"a value appears twice in '{text}'")
        return names
    return parse


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants an integer, got '{text}'") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"wants an integer >= 1, got '{text}'")
    return v


def _non_negative_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants a number, got '{text}'") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"wants a number >= 0, got '{text}'")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m fmha.tools.bench_peers", allow_abbrev=False,
                                description="Times JAX, PyTorch and fmha's bindings with fmha-bench's "
                                            "flags and row schema.")
    p.add_argument("--seqs", type=_int_list, default=[128, 256, 512, 1024, 2048],
                   help="sequence lengths (default 128,256,512,1024,2048)")
    p.add_argument("--dims", type=_int_list, default=[64], help="head dims (default 64)")
    p.add_argument("--dtypes", type=_name_list(DTYPES), default=["float32"],
                   help="float32,bfloat16,float16 (default float32; bfloat16 needs ml_dtypes)")
    p.add_argument("--variants", type=_name_list(VARIANTS), default=["plain"],
                   help="plain,causal,masked_bias,decode (default plain, as fmha-bench)")
    p.add_argument("--modes", type=_name_list(MODES), default=list(MODES), help="fwd,fwdbwd (default both)")
    p.add_argument("--batch", type=_positive_int, default=1)
    p.add_argument("--heads", type=_positive_int, default=8)
    p.add_argument("--seq-q", type=_positive_int, default=None,
                   help="query length (default: the seq; e.g. 1 for decoding)")
    p.add_argument("--heads-kv", type=_positive_int, default=None,
                   help="key/value heads (default: the heads; fewer for GQA)")
    p.add_argument("--impls", type=_name_list(IMPLS), default=list(IMPLS))
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="threads for every runtime (default: each runtime's own default)")
    p.add_argument("--no-ref", action="store_true", help="skip rel_err (the float64 reference)")
    p.add_argument("--out", default="results.json")
    p.add_argument("--append", action="store_true", help="add rows and this config to an existing --out file")
    p.add_argument("--note", default=None)
    testing = p.add_argument_group("testing")
    testing.add_argument("--min-samples", type=_positive_int, default=7)
    testing.add_argument("--min-sample-ms", type=_non_negative_float, default=20.0)
    args = p.parse_args(argv)
    if args.threads is not None and args.threads > 1024:
        p.error("--threads wants 1..1024")
    if args.heads_kv is not None and args.heads % args.heads_kv:
        p.error(f"--heads-kv {args.heads_kv} does not divide --heads {args.heads}")
    return args


def pin_threads(n):
    """Thread settings that must precede importing JAX and PyTorch: the
    process is bound to n CPUs (every runtime sizes its pools from the CPUs
    it may run on), XLA gets intra_op_parallelism_threads=n (and single-
    threaded Eigen for n == 1), the OpenMP/BLAS pools n threads. Returns
    the XLA_FLAGS used."""
    if n is None:
        return os.environ.get("XLA_FLAGS")
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > n:
            os.sched_setaffinity(0, cpus[:n])
    eigen = "false" if n == 1 else "true"
    # The first token must be a --flag, or XLA reads the value as a file name.
    extra = f"--xla_cpu_multi_thread_eigen={eigen} intra_op_parallelism_threads={n}"
    os.environ["XLA_FLAGS"] = (extra + " " + os.environ.get("XLA_FLAGS", "")).strip()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    return os.environ["XLA_FLAGS"]


# ---- inputs (fmha-bench's stream) ---------------------------------------------------------

class Stream:
    """splitmix64 as fmha-bench uses it: uniform floats in [-1, 1)."""

    GAMMA = np.uint64(0x9E3779B97F4A7C15)

    def __init__(self, seed):
        self.state = np.uint64(seed)

    def uniform(self, n):
        with np.errstate(over="ignore"):
            z = self.state + self.GAMMA * np.arange(1, n + 1, dtype=np.uint64)
            self.state = self.state + self.GAMMA * np.uint64(n)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        return ((z >> np.uint64(40)).astype(np.float64) * (2.0 / 16777216.0) - 1.0).astype(np.float32)


def t5_bucket(rel, num_buckets, max_distance, bidirectional):
    """T5 bucket of rel = key - query (fmha_rel_bucket's definition)."""
    n = -np.asarray(rel, np.int64)
    nb = num_buckets
    base = np.zeros_like(n)
    if bidirectional:
        nb //= 2
        base = np.where(n < 0, nb, 0)
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    if nb <= 1:
        return np.minimum(base, num_buckets - 1)
    max_exact = nb // 2
    large = np.full_like(n, nb - 1)
    if max_distance > max_exact:
        v = max_exact + np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact) * (
            nb - max_exact) + 1e-9
        large = np.where(v < nb - 1, np.floor(v).astype(np.int64), large)
    return base + np.where(n < max_exact, n, large)


def bucket_matrix(Sq, S):
    """[Sq, S] int32 bucket of (query i, key j), from the C library when it has one."""
    rel = np.arange(-(Sq - 1), S)
    buckets = None
    try:
        from .. import _lib

        if hasattr(_lib.load(), "fmha_rel_bucket"):
            buckets = np.array([_lib.rel_bucket(r, REL_BUCKETS, REL_MAX_DISTANCE, True) for r in rel], np.int64)
    except ImportError:
        pass
    if buckets is None:
        buckets = t5_bucket(rel, REL_BUCKETS, REL_MAX_DISTANCE, True)
    i = np.arange(Sq)[:, None]
    j = np.arange(S)[None, :]
    return buckets[(j - i) + (Sq - 1)].astype(np.int32)


class Inputs:
    """One (variant, seq, dim, dtype)'s inputs, shared by every impl and mode.
    seq_q and heads_kv: None for S and H (the rows then carry no such field)."""

    def __init__(self, B, S, H, D, variant, dtype, seq_q=None, heads_kv=None):
        stream = Stream(INPUT_SEED)
        Sq, Hkv = seq_q or (1 if variant == "decode" else S), heads_kv or H
        # q [B, Sq, H, D], k and v [B, S, Hkv, D], dO [B, Sq, H, D], in fmha-bench's draw order
        self.q = stream.uniform(B * Sq * H * D).reshape(B, Sq, H, D)
        self.k, self.v = (stream.uniform(B * S * Hkv * D).reshape(B, S, Hkv, D) for _ in range(2))
        self.d_o = stream.uniform(B * Sq * H * D).reshape(B, Sq, H, D)
        self.B, self.S, self.H, self.D, self.variant, self.dtype = B, S, H, D, variant, dtype
        # decode rows always carry their query length
        self.Sq, self.Hkv, self.seq_q, self.heads_kv = Sq, Hkv, Sq if variant == "decode" else seq_q, heads_kv
        self.causal = variant in CAUSAL_VARIANTS and Sq == S   # top-left = bottom-right here
        self.table = self.mask = self.buckets = None
        if variant in CAUSAL_VARIANTS and Sq != S:
            # bottom-right: query i sees key j iff j <= i + S - Sq
            visible = np.arange(S)[None, :] <= np.arange(Sq)[:, None] + (S - Sq)
            self.mask = np.broadcast_to(visible, (B, 1, Sq, S)).copy()
        if variant == "masked_bias":
            self.table = stream.uniform(H * REL_BUCKETS).reshape(H, REL_BUCKETS)
            kv_len = S - S // 8
            self.mask = np.broadcast_to(np.arange(S)[None, None, None, :] < kv_len, (B, 1, Sq, S)).copy()
            self.buckets = bucket_matrix(Sq, S)
        if dtype != "float32":
            np_dtype = _numpy_dtype(dtype)
            # Round once: every impl and the reference see the same values.
            self.q, self.k, self.v, self.d_o = (x.astype(np_dtype).astype(np.float32)
                                                for x in (self.q, self.k, self.v, self.d_o))
        self._o_ref = self._grad_ref = None

    def dense_bias(self):
        return self.table[:, self.buckets][None] if self.table is not None else None

    def reference(self, fwdbwd):
        """float64 O, or (dQ, dK, dV) concatenated."""
        if fwdbwd and self._grad_ref is None or not fwdbwd and self._o_ref is None:
            self._compute_reference()
        return self._grad_ref if fwdbwd else self._o_ref

    def _compute_reference(self):
        B, S, H, D, Sq, Hkv = self.B, self.S, self.H, self.D, self.Sq, self.Hkv
        scale = 1.0 / math.sqrt(D)
        bias = self.dense_bias()
        o = np.empty((B, Sq, H, D))
        dq = np.empty_like(o)
        dk, dv = np.zeros((B, S, Hkv, D)), np.zeros((B, S, Hkv, D))
        visible = np.ones((Sq, S), bool)
        if self.causal:
            visible &= np.tril(np.ones((Sq, S), bool))
        for b in range(B):
            vis = visible & self.mask[b, 0] if self.mask is not None else visible
            for h in range(H):
                hk = h // (H // Hkv)
                q = self.q[b, :, h].astype(np.float64)
                k = self.k[b, :, hk].astype(np.float64)
                v = self.v[b, :, hk].astype(np.float64)
                do = self.d_o[b, :, h].astype(np.float64)
                s = scale * (q @ k.T)
                if bias is not None:
                    s += bias[0, h]
                s = np.where(vis, s, -np.inf)
                top = s.max(axis=1, keepdims=True)
                p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
                total = p.sum(axis=1, keepdims=True)
                p /= np.where(total > 0, total, 1.0)   # a row that sees no key: O = 0
                o[b, :, h] = p @ v
                dp = do @ v.T
                ds = p * (dp - (do * o[b, :, h]).sum(axis=1, keepdims=True))
                dq[b, :, h] = scale * (ds @ k)
                dk[b, :, hk] += scale * (ds.T @ q)
                dv[b, :, hk] += p.T @ do
        self._o_ref = o
        self._grad_ref = np.concatenate([dq.ravel(), dk.ravel(), dv.ravel()])


def _numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def rel_error(x, ref):
    x = np.asarray(x, np.float64).ravel()
    ref = np.asarray(ref, np.float64).ravel()
    den = float(np.dot(ref, ref))
    num = float(np.dot(x - ref, x - ref))
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


# ---- the impls --------------------------------------------------------------------------

class Unavailable(Exception):
    """The impl's runtime is not installed (row status "unavailable")."""


class Runner:
    """A prepared impl x case: run() does one timed call, result() the values for rel_err."""

    temp_bytes = None

    def run(self):
        raise NotImplementedError

    def result(self):
        raise NotImplementedError


def _import_jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise Unavailable(f"jax is not installed ({e})") from None
    return jax, jnp


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not installed ({e})") from None
    return torch


def _import_openvino():
    try:
        import openvino
        import openvino.opset13 as ops
    except ImportError as e:
        raise Unavailable(f"openvino is not installed ({e})") from None
    return openvino, ops


def native_keywords(inp, kv_lengths, table):
    """fmha's own keywords for a case (the *_native impls): no dense tensor."""
    kw = {"is_causal": inp.variant in CAUSAL_VARIANTS}
    if inp.variant in CAUSAL_VARIANTS and inp.Sq != inp.S:
        kw["causal_alignment"] = "bottom_right"
    if inp.variant == "masked_bias":
        kw.update(key_value_seq_lengths=kv_lengths, rel_table=table, rel_max_distance=REL_MAX_DISTANCE,
                  rel_bidirectional=True)
    return kw


class JaxRunner(Runner):
    def __init__(self, inp, fwdbwd, use_fmha, native=False):
        jax, jnp = _import_jax()
        if use_fmha:
            try:
                from .. import jax as fmha_jax
            except ImportError as e:
                raise Unavailable(str(e)) from None
            fmha_jax._ensure_registered()  # the FFI build is not part of compile_s
            attend = fmha_jax.dot_product_attention
        else:
            def attend(q, k, v, bias=None, mask=None, is_causal=False):
                return jax.nn.dot_product_attention(q, k, v, bias, mask, is_causal=is_causal,
                                                    implementation="xla")
        dtype = jnp.dtype(inp.dtype)
        causal = inp.causal
        self.args = [jnp.asarray(x, dtype) for x in (inp.q, inp.k, inp.v)]
        d_o = jnp.asarray(inp.d_o, dtype)
        buckets = jnp.asarray(inp.buckets) if inp.buckets is not None else None
        mask = jnp.asarray(inp.mask) if inp.mask is not None else None
        if inp.table is not None:
            self.args.append(jnp.asarray(inp.table))

        kv_lengths = jnp.full((inp.B,), inp.S - inp.S // 8, jnp.int32)

        def forward(q, k, v, table=None):
            if native:
                return attend(q, k, v, **native_keywords(inp, kv_lengths, table))
            bias = table[:, buckets][None] if table is not None else None
            return attend(q, k, v, bias, mask, is_causal=causal)

        if fwdbwd:
            def step(*args):
                out, vjp = jax.vjp(forward, *args)
                return vjp(d_o)
        else:
            step = forward
        start = time.perf_counter()
        compiled = jax.jit(step).lower(*self.args).compile()
        self.fn = compiled
        self.out = jax.block_until_ready(self.fn(*self.args))
        self.compile_s = time.perf_counter() - start
        self.fwdbwd = fwdbwd
        try:
            ma = compiled.memory_analysis()
            self.temp_bytes = ma.temp_size_in_bytes
            self.arg_bytes = ma.argument_size_in_bytes
            self.out_bytes = ma.output_size_in_bytes
        except Exception:  # noqa: BLE001 - not every backend reports memory
            self.temp_bytes = self.arg_bytes = self.out_bytes = None
        if use_fmha and self.temp_bytes is not None:
            self.temp_bytes += fmha_workspace_bytes(inp, fwdbwd)

    def run(self):
        self.out = self.fn(*self.args)
        import jax

        jax.block_until_ready(self.out)

    def result(self):
        if self.fwdbwd:
            return np.concatenate([np.asarray(g, np.float64).ravel() for g in self.out[:3]])
        return np.asarray(self.out, np.float64)


class TorchRunner(Runner):
    def __init__(self, inp, fwdbwd, use_fmha, native=False):
        torch = _import_torch()
        if use_fmha:
            try:
                from .. import torch as fmha_torch
            except ImportError as e:
                raise Unavailable(str(e)) from None
            attend = fmha_torch.scaled_dot_product_attention
        else:
            attend = torch.nn.functional.scaled_dot_product_attention
        self.torch = torch
        dtype = getattr(torch, inp.dtype)
        # [B, S, H, D] -> [B, H, S, D], contiguous as PyTorch code keeps it.
        self.args = [torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3))).to(dtype)
                     for x in (inp.q, inp.k, inp.v)]
        self.d_o = torch.from_numpy(np.ascontiguousarray(inp.d_o.transpose(0, 2, 1, 3))).to(dtype)
        self.table = torch.from_numpy(inp.table.copy()) if inp.table is not None else None
        buckets = torch.from_numpy(inp.buckets.astype(np.int64)) if inp.buckets is not None else None
        visible = torch.from_numpy(inp.mask) if inp.mask is not None else None
        causal = inp.causal
        gqa = {"enable_gqa": True} if inp.Hkv != inp.H else {}
        self.fwdbwd = fwdbwd
        if fwdbwd:
            for t in self.args:
                t.requires_grad_(True)
            if self.table is not None:
                self.table.requires_grad_(True)

        kv_lengths = torch.full((inp.B,), inp.S - inp.S // 8, dtype=torch.int32)

        def forward():
            if native:
                return attend(*self.args, **native_keywords(inp, kv_lengths, self.table), **gqa)
            attn_mask = visible
            if self.table is not None:
                attn_mask = self.table[:, buckets][None].masked_fill(~visible, float("-inf")).to(dtype)
            return attend(*self.args, attn_mask=attn_mask, is_causal=causal, **gqa)

        self.forward = forward
        self.grad_inputs = self.args + ([self.table] if self.table is not None else [])
        start = time.perf_counter()
        self.run()
        self.compile_s = time.perf_counter() - start
        elem = self.args[0].element_size()
        n_q, n_kv = self.args[0].numel(), self.args[1].numel()   # q and dO; k and v
        table_bytes = inp.table.nbytes if inp.table is not None else 0
        mask_bytes = inp.mask.nbytes if inp.mask is not None else 0
        self.arg_bytes = ((2 if fwdbwd else 1) * n_q + 2 * n_kv) * elem + table_bytes + mask_bytes
        self.out_bytes = ((2 * n_q + 2 * n_kv) * elem + table_bytes) if fwdbwd else n_q * elem
        self.temp_bytes = fmha_workspace_bytes(inp, fwdbwd) if use_fmha else None

    def run(self):
        torch = self.torch
        if self.fwdbwd:
            out = self.forward()
            self.out = torch.autograd.grad(out, self.grad_inputs, self.d_o)
        else:
            with torch.no_grad():
                self.out = self.forward()

    def result(self):
        if self.fwdbwd:
            # [B, H, S, D] gradients back to [B, S, H, D] order
            return np.concatenate([g.float().numpy().transpose(0, 2, 1, 3).astype(np.float64).ravel()
                                   for g in self.out[:3]])
        return self.out.float().numpy().transpose(0, 2, 1, 3).astype(np.float64)


class OpenVINORunner(Runner):
    """One SDPA node in an OpenVINO model: q [B, H, Sq, D] against k, v
    [B, H, S, D] (under GQA q [B, Hkv, G, Sq, D] against [B, Hkv, 1, S, D],
    by broadcasting; G = H / Hkv), the row's mask as an additive [.., Sq, S] input (the bias with -inf where a key is hidden,
    as torch_sdpa gets it), causal with Sq = S as the node's own flag."""

    ELEMENT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

    def __init__(self, inp, fwdbwd, threads):
        if fwdbwd:
            raise Unavailable("OpenVINO runs inference only: no backward")
        ov, ops = _import_openvino()
        et = getattr(ov.Type, self.ELEMENT[inp.dtype])
        B, H, Hkv, Sq, S, D = inp.B, inp.H, inp.Hkv, inp.Sq, inp.S, inp.D
        G = H // Hkv
        np_dtype = _numpy_dtype(inp.dtype)

        def tensor(x):
            x = np.ascontiguousarray(x.astype(np_dtype))
            raw = x.view(np.uint16) if x.dtype.itemsize == 2 else x
            return ov.Tensor(raw, list(x.shape), et)

        # [B, S, H, D] -> [B, H, Sq, D] and [B, H, S, D]; under GQA [B, Hkv, G, Sq, D]
        # and [B, Hkv, 1, S, D] (the plugin's fused kernel takes 4-d inputs only)
        q = inp.q.transpose(0, 2, 1, 3)
        k, v = (x.transpose(0, 2, 1, 3) for x in (inp.k, inp.v))
        if G > 1:
            q, k, v = q.reshape(B, Hkv, G, Sq, D), k[:, :, None], v[:, :, None]
        params = [ops.parameter(list(x.shape), et) for x in (q, k, v)]
        feeds = [tensor(x) for x in (q, k, v)]
        mask = None
        if inp.mask is not None:
            mask = np.where(inp.mask, 0.0, -np.inf).astype(np.float32)        # [B, 1, Sq, S]
            if inp.table is not None:
                mask = mask + inp.dense_bias()                                # [B, H, Sq, S]
            mask = mask.reshape((B, -1, Sq, S) if G == 1 else (B, mask.shape[1] // G or 1, -1, Sq, S))
            params.append(ops.parameter(list(mask.shape), et))
            feeds.append(tensor(mask))
        node = ops.scaled_dot_product_attention(*params, causal=inp.causal)  # scale 1/sqrt(D), its default
        core = ov.Core()
        config = {"INFERENCE_PRECISION_HINT": self.ELEMENT[inp.dtype]}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        core.set_property("CPU", config)
        start = time.perf_counter()
        self.request = core.compile_model(ov.Model([node], params), "CPU").create_infer_request()
        self.feeds, self.shape, self.np_dtype = feeds, (B, H, Sq, D), np_dtype
        self.run()
        self.compile_s = time.perf_counter() - start
        elem = np.dtype(np_dtype).itemsize
        self.arg_bytes = (q.size + k.size + v.size + (mask.size if mask is not None else 0)) * elem
        self.out_bytes = q.size * elem

    def run(self):
        self.request.infer(self.feeds)

    def result(self):
        out = np.array(self.request.get_output_tensor(0).data)
        if np.dtype(self.np_dtype).itemsize == 2:
            out = out.view(np.uint16).view(self.np_dtype)
        # [B, H, Sq, D] (or [B, Hkv, G, Sq, D]) -> [B, Sq, H, D]
        return out.reshape(self.shape).astype(np.float64).transpose(0, 2, 1, 3)


def fmha_workspace_bytes(inp, fwdbwd):
    """The workspace fmha allocates inside its calls (XLA and PyTorch do not see it)."""
    import ctypes

    from .. import _lib, api

    B, S, H, D = inp.B, inp.S, inp.H, inp.D
    p = _lib.problem_init(B, H, inp.Hkv, inp.Sq, S, D, D)
    p.dtype = api.dtype_code(_numpy_dtype(inp.dtype))
    p.causal = _lib.CAUSAL_TOP_LEFT if inp.causal else _lib.CAUSAL_NONE
    keep = []
    if inp.mask is not None:
        flag = np.ones(1, np.uint8)
        api.set_dense_mask(p, flag.ctypes.data, [0, 0, 0, 0])
        keep.append(flag)
    if inp.table is not None:
        one = np.zeros(1, np.float32)
        api.set_dense_bias(p, one.ctypes.data, [0, 0, 0, 0])
        keep.append(one)
    lib = _lib.load()
    fwd, bwd = ctypes.c_size_t(0), ctypes.c_size_t(0)
    if lib.fmha_forward_workspace_size(ctypes.byref(p), ctypes.byref(fwd)) != _lib.OK:
        return 0
    if fwdbwd and lib.fmha_backward_workspace_size(ctypes.byref(p), ctypes.byref(bwd)) == _lib.OK:
        return max(fwd.value, bwd.value)
    return fwd.value


RUNNERS = {
    "jax_xla": lambda inp, fb: JaxRunner(inp, fb, use_fmha=False),
    "openvino_sdpa": lambda inp, fb, threads: OpenVINORunner(inp, fb, threads),
    "fmha_jax": lambda inp, fb: JaxRunner(inp, fb, use_fmha=True),
    "torch_sdpa": lambda inp, fb: TorchRunner(inp, fb, use_fmha=False),
    "fmha_torch": lambda inp, fb: TorchRunner(inp, fb, use_fmha=True),
    "fmha_jax_native": lambda inp, fb: JaxRunner(inp, fb, use_fmha=True, native=True),
    "fmha_torch_native": lambda inp, fb: TorchRunner(inp, fb, use_fmha=True, native=True),
}


# ---- measuring ----------------------------------------------------------------------------

def time_calls(run, calls):
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return time.perf_counter() - start


def quantile(sorted_x, q):
    pos = q * (len(sorted_x) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (pos - lo) * (sorted_x[hi] - sorted_x[lo])


def measure(runner, min_samples, min_sample_ms):
    """(inner, per-call ms samples sorted): fmha-bench's calibration."""
    inner, min_s = 1, min_sample_ms * 1e-3
    while True:
        t = time_calls(runner.run, inner)
        if t >= min_s or inner >= MAX_INNER:
            break
        nxt = math.ceil(inner * 1.1 * min_s / max(t, 1e-9))
        inner = min(nxt, MAX_INNER) if nxt > 2 * inner else 2 * inner
    samples = sorted(time_calls(runner.run, inner) * 1e3 / inner for _ in range(min_samples))
    return inner, samples


def row_header(impl, mode, variant, dtype, B, S, H, D, seq_q=None, heads_kv=None):
    row = {"impl": impl, "mode": mode, "variant": variant, "dtype": dtype, "batch": B, "seq": S, "heads": H,
           "head_dim": D}
    if seq_q is not None:
        row["seq_q"] = seq_q
    if heads_kv is not None:
        row["heads_kv"] = heads_kv
    return row


def scores_seen(inp):
    """Query-key pairs a call computes, as fmha-bench counts them: Sq x S,
    half when causal and square, else per query under bottom-right."""
    if inp.variant not in CAUSAL_VARIANTS:
        return float(inp.Sq) * inp.S
    if inp.Sq == inp.S:
        return 0.5 * inp.S * inp.S
    seen = np.clip(np.arange(inp.Sq) + inp.S - inp.Sq + 1, 0, inp.S)
    return float(seen.sum())


def status_of(exc):
    try:
        from .._lib import FmhaError
    except ImportError:  # pragma: no cover
        FmhaError = ()
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, FmhaError):
        return "unsupported" if exc.unsupported else ("oom" if exc.name == "FMHA_ERR_OUT_OF_MEMORY" else "error")
    if isinstance(exc, MemoryError):
        return "oom"
    return "error"


def bench_row(impl, mode, inp, args):
    row = row_header(impl, mode, inp.variant, inp.dtype, inp.B, inp.S, inp.H, inp.D, inp.seq_q, inp.heads_kv)
    row["kind"] = "time"
    fwdbwd = mode == "fwdbwd"
    try:
        runner = RUNNERS[impl](inp, fwdbwd, args.threads) if impl == "openvino_sdpa" else RUNNERS[impl](inp, fwdbwd)
        inner, samples = measure(runner, args.min_samples, args.min_sample_ms)
    except Exception as e:  # noqa: BLE001 - every failure becomes a row
        row["status"] = status_of(e)
        text = str(e) if isinstance(e, Unavailable) else f"{type(e).__name__}: {e}"
        row["error"] = (text.splitlines() or [""])[0][:500]
        return row
    median = quantile(samples, 0.5)
    flops = 4.0 * inp.B * inp.H * scores_seen(inp) * inp.D * (3.5 if fwdbwd else 1.0)
    # K and V of every (batch, kv head), read once: the floor of any forward
    kv_bytes = 2.0 * inp.k.size * np.dtype(_numpy_dtype(inp.dtype)).itemsize
    row.update(status="ok", compile_s=runner.compile_s, inner=inner, samples=len(samples), median_ms=median,
               q1_ms=quantile(samples, 0.25), q3_ms=quantile(samples, 0.75))
    if not args.no_ref:
        row["rel_err"] = rel_error(runner.result(), inp.reference(fwdbwd))
    for key, value in (("temp_mb", runner.temp_bytes), ("arg_mb", runner.arg_bytes), ("out_mb", runner.out_bytes)):
        row[key] = value / MB if value is not None else None
    row["gflops"] = flops / 1e9 / (median * 1e-3)
    row["kv_gbs"] = kv_bytes / 1e9 / (median * 1e-3)
    return row


# ---- the record ---------------------------------------------------------------------------

def _version(module):
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "unknown")
    except ImportError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_info(threads):
    info = {"backend": "cpu", "device_kind": "cpu", "cpu": _cpu_model(), "logical_cpus": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__}
    for name in ("jax", "jaxlib", "torch", "openvino", "ml_dtypes"):
        v = _version(name)
        if v is not None:
            info[name] = v
    try:
        from .. import _lib

        info["fmha_version"] = _lib.version_string()
        info["isa"] = _lib.isa_name()
        info["threads"] = _lib.get_num_threads()
    except ImportError:
        pass
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    info["peer_threads"] = threads
    return info


def config_of(args, xla_flags):
    return {"device": "cpu", "tool": "fmha.bench_peers", "append": args.append,
            "seqs": ",".join(map(str, args.seqs)), "dims": ",".join(map(str, args.dims)),
            "dtypes": ",".join(args.dtypes), "variants": ",".join(args.variants), "modes": ",".join(args.modes),
            "batch": args.batch, "heads": args.heads, "seq_q": args.seq_q, "heads_kv": args.heads_kv,
            "impls": ",".join(args.impls), "no_ref": args.no_ref,
            "threads": args.threads, "xla_flags": xla_flags, "min_samples": args.min_samples,
            "min_sample_ms": args.min_sample_ms, "out": args.out}


def read_record(path):
    """The existing record, or None when the file does not exist. ValueError when unreadable."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
        raise ValueError(f"{path} is not a benchmark record")
    return doc


def write_atomically(path, doc):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".bench_peers-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def merge(old, device, config, rows, note):
    if old is None:
        configs = [config]
        doc = {"device": device, "config": config, "results": rows, "configs": configs}
        doc["note"] = note or ("fmha.bench_peers: JAX, PyTorch and fmha's bindings; median and quartiles of "
                               "per-call time over samples of >= 20 ms; rel_err against a float64 reference.")
        return doc
    doc = dict(old)
    merged_device = dict(old.get("device") or {})
    # Keep the C tool's fields (CPU, ISA, commit); add the peers' versions.
    for key, value in device.items():
        if key not in merged_device or key in ("jax", "jaxlib", "torch", "numpy", "ml_dtypes", "python",
                                               "torch_threads", "peer_threads"):
            merged_device[key] = value
    doc["device"] = merged_device
    doc["results"] = list(old.get("results", [])) + rows
    configs = list(old.get("configs") or [])
    if old.get("config") is not None and old.get("config") not in configs:
        configs.insert(0, old["config"])
    configs.append(config)
    doc["configs"] = configs
    if note:
        doc["note"] = note
    return doc


# The table fmha-bench prints too: the same columns and widths. spread is
# (q3 - q1) / median; a row past SPREAD_FLAG is marked '!'.
SPREAD_FLAG = 0.25
TABLE_FORMAT = "{:<20} {:<7} {:<12} {:<9} {:>4} {:>7} {:>10} {:>19} {:>7} {:>9} {:>8} {:>9}  {}"
TABLE_HEADER = TABLE_FORMAT.format("impl", "mode", "variant", "dtype", "D", "seq", "median_ms", "q1..q3_ms",
                                   "spread", "GFLOP/s", "KV_GB/s", "rel_err", "status")


def _number(row, key, fmt):
    v = row.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    if fmt == "%.4g" and abs(v) >= 1e4:
        return "%.0f" % v   # no exponent for large values, as fmha-bench
    return fmt % v


def spread_of(row):
    """(q3 - q1) / median, or None for a row without timings."""
    q1, q3, median = row.get("q1_ms"), row.get("q3_ms"), row.get("median_ms")
    if None in (q1, q3, median) or not median > 0:
        return None
    return (q3 - q1) / median


def format_row(row):
    """One line of the table (fmha-bench's format)."""
    spread = spread_of(row)
    if spread is None:
        span = shown = "-"
    else:
        span = f"{_number(row, 'q1_ms', '%.4g')}..{_number(row, 'q3_ms', '%.4g')}"
        shown = "%.0f%%" % (100 * spread) + ("!" if spread > SPREAD_FLAG else "")
    line = TABLE_FORMAT.format(row["impl"], row["mode"], row["variant"], row["dtype"], _number(row, "head_dim", "%.0f"),
                               _number(row, "seq", "%.0f"), _number(row, "median_ms", "%.4g"), span, shown,
                               _number(row, "gflops", "%.4g"), _number(row, "kv_gbs", "%.3g"),
                               _number(row, "rel_err", "%.2e"), row.get("status"))
    return line + (f" ({row['error']})" if row.get("error") else "")


def table_notes(rows):
    """The lines under the table: how many rows have a large spread."""
    flagged = sum(1 for r in rows if (spread_of(r) or 0) > SPREAD_FLAG)
    if not flagged:
        return []
    return [f"! {flagged} row{'' if flagged == 1 else 's'} with q1..q3 wider than {100 * SPREAD_FLAG:.0f}% of "
            "the median: the machine was busy or the clock changed; rerun them"]


def _duration(seconds):
    """m:ss, or h:mm:ss past an hour (fmha-bench's)."""
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def progress_line(done, total, what, elapsed):
    """[row i/n] what  elapsed m:ss, ~m:ss left: the rows to come are assumed
    to take as long as those done (fmha-bench's progress line)."""
    line = f"[row {done}/{total}] {what}  elapsed {_duration(elapsed)}"
    if done > 1:
        line += f", ~{_duration(elapsed / (done - 1) * (total - done + 1))} left"
    return line


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    xla_flags = pin_threads(args.threads)
    old = None
    if args.append:
        try:
            old = read_record(args.out)
        except ValueError as e:
            print(f"bench_peers: {e}; nothing written", file=sys.stderr)
            return 1
    if args.threads is not None:
        try:
            import torch

            torch.set_num_threads(args.threads)
        except ImportError:
            pass
        try:
            from .. import _lib

            _lib.set_num_threads(args.threads)
        except ImportError:
            pass

    rows = []
    start = time.perf_counter()
    print(TABLE_HEADER, flush=True)
    total = len(args.dtypes) * len(args.dims) * len(args.variants) * len(args.seqs) * len(args.modes) * len(args.impls)
    done = 0
    for dtype in args.dtypes:
        for D in args.dims:
            for variant in args.variants:
                for S in args.seqs:
                    inp = Inputs(args.batch, S, args.heads, D, variant, dtype, args.seq_q, args.heads_kv)
                    for mode in args.modes:
                        for impl in args.impls:
                            done += 1
                            what = f"{impl} {mode} {variant} seq={S}" + ("" if dtype == "float32" else f" {dtype}")
                            print(progress_line(done, total, what, time.perf_counter() - start), file=sys.stderr,
                                  flush=True)
                            row = bench_row(impl, mode, inp, args)
                            print(format_row(row), flush=True)
                            rows.append(row)
    for line in table_notes(rows):
        print(line)
    device = device_info(args.threads)
    config = config_of(args, xla_flags)
    try:
        if args.append:
            old = read_record(args.out)  # re-read: another writer may have added rows meanwhile
        write_atomically(args.out, merge(old, device, config, rows, args.note))
    except (ValueError, OSError) as e:
        print(f"bench_peers: {e}", file=sys.stderr)
        return 1
    print(f"bench_peers: wrote {len(rows)} new rows to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
