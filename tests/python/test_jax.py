"""test_jax: fmha.jax.dot_product_attention (XLA FFI custom calls) against
jax.nn.dot_product_attention and the float64 reference: outputs and
gradients of query, key, value and bias under jit, grad and vmap; masks,
padding lengths and windows (skipped while the C library answers
FMHA_ERR_UNSUPPORTED); bf16; errors; and `import fmha` without JAX."""

import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import fmha.jax as fj  # noqa: E402
from fmha._lib import FmhaError  # noqa: E402

from conftest import jax_reference as reference  # noqa: E402  (fmha.jax follows jax.nn where no key is seen)
from conftest import rel_error, require, uniform  # noqa: E402

TOL = 2e-5
PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(fj.__file__)))


def qkv(rng, B, T, S, N, K, H, dtype=np.float32):
    return uniform(rng, (B, T, N, H), dtype), uniform(rng, (B, S, K, H), dtype), uniform(rng, (B, S, K, H), dtype)


def output_and_grads(fn, q, k, v, bias, d_o, **kw):
    """One jit: fn's output and the vector-Jacobian product with d_o for q,
    k, v (and bias when given)."""
    def run(q, k, v, bias):
        if bias is None:
            out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kw), q, k, v)
        else:
            out, vjp = jax.vjp(lambda q, k, v, b: fn(q, k, v, b, **kw), q, k, v, bias)
        return out, vjp(d_o.astype(out.dtype))

    out, grads = jax.jit(run)(q, k, v, bias)
    return np.asarray(out), [np.asarray(g) for g in grads]


def compare_with_jax(q, k, v, bias=None, ref_kw=None, **kw):
    rng = np.random.default_rng(q.size)
    d_o = uniform(rng, q.shape[:-1] + v.shape[-1:])
    ours = output_and_grads(fj.dot_product_attention, q, k, v, bias, d_o, **kw)
    theirs = output_and_grads(jax.nn.dot_product_attention, q, k, v, bias, d_o, **kw)
    np.testing.assert_allclose(ours[0], theirs[0], atol=2e-6)
    for a, b in zip(ours[1], theirs[1]):
        assert a.shape == b.shape
        assert rel_error(a, b) < TOL
    if ref_kw is not None:
        ref = reference(q, k, v, bias=bias, d_out=d_o, **ref_kw)
        assert rel_error(ours[0], ref["o"]) < TOL
        for got, name in zip(ours[1], ("dq", "dk", "dv", "d_bias")):
            assert rel_error(got, ref[name]) < TOL, name
    return ours


SHAPES = [  # B, T, S, N, K, H
    (1, 8, 8, 2, 2, 8),
    (2, 13, 21, 4, 2, 16),   # tails, GQA
    (1, 33, 17, 4, 1, 32),   # MQA, T > S
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_outputs_and_gradients(shape, is_causal):
    rng = np.random.default_rng(sum(shape))
    q, k, v = qkv(rng, *shape)
    compare_with_jax(q, k, v, is_causal=is_causal, ref_kw=dict(is_causal=is_causal))


def test_scale_and_three_d_inputs():
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng, 1, 9, 12, 4, 2, 8)
    compare_with_jax(q[0], k[0], v[0], scale=0.37)


@pytest.mark.parametrize("bias_shape", [(2, 4, 11, 14), (2, 1, 1, 14), (11, 14)])
def test_bias_gradient(bias_shape):
    require("bias")
    rng = np.random.default_rng(len(bias_shape))
    q, k, v = qkv(rng, 2, 11, 14, 4, 2, 8)
    bias = rng.normal(size=bias_shape).astype(np.float32)
    compare_with_jax(q, k, v, bias, ref_kw=dict())


def test_mask_lengths_window():
    require("mask", "q_lengths", "kv_lengths", "window")
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, 2, 12, 15, 4, 2, 8)
    mask = rng.uniform(size=(2, 1, 12, 15)) > 0.3
    mask[..., 0] = True
    # Combinations where every query row keeps a visible key (jax.nn averages
    # the values of a row that sees none, fmha gives zeros).
    kv_lengths = np.array([15, 6], np.int32)
    compare_with_jax(q, k, v, mask=mask, key_value_seq_lengths=kv_lengths,
                     ref_kw=dict(mask=mask, kv_lengths=kv_lengths))
    q_lengths = np.array([5, 12], np.int32)
    compare_with_jax(q, k, v, query_seq_lengths=q_lengths, local_window_size=(3, 1), is_causal=True,
                     ref_kw=dict(q_lengths=q_lengths, window=(3, 1), is_causal=True))


def test_return_residual():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng, 2, 7, 9, 2, 2, 8)
    out, res = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True,
                                                                 return_residual=True))(q, k, v)
    out2, res2 = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                                       return_residual=True))(q, k, v)
    assert res.shape == res2.shape == (2, 7, 2)
    np.testing.assert_allclose(out, out2, atol=2e-6)
    np.testing.assert_allclose(res, res2, atol=2e-6)


def test_vmap():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng, 2, 6, 7, 4, 2, 8)
    qs = uniform(rng, (3,) + q.shape)
    ks = uniform(rng, (3,) + k.shape)

    def both(fn, *args, in_axes):
        return [np.asarray(jax.jit(jax.vmap(f, in_axes=in_axes))(*args)) for f in fn]

    def attend(impl):
        return lambda q, k: impl(q, k, v, is_causal=True)

    a, b = both([attend(fj.dot_product_attention), attend(jax.nn.dot_product_attention)], qs, k, in_axes=(0, None))
    np.testing.assert_allclose(a, b, atol=2e-6)
    a, b = both([attend(fj.dot_product_attention), attend(jax.nn.dot_product_attention)], qs, ks, in_axes=(0, 0))
    np.testing.assert_allclose(a, b, atol=2e-6)
    # nested vmap and per-example gradients
    nested = jax.vmap(jax.vmap(attend(fj.dot_product_attention), in_axes=(0, None)), in_axes=(None, 0))
    want = jax.vmap(jax.vmap(attend(jax.nn.dot_product_attention), in_axes=(0, None)), in_axes=(None, 0))
    np.testing.assert_allclose(jax.jit(nested)(qs, ks), want(qs, ks), atol=2e-6)

    def per_example_grads(impl):
        return jax.jit(jax.vmap(jax.grad(lambda q, k: jnp.sum(attend(impl)(q, k) ** 2), argnums=(0, 1)),
                                in_axes=(0, None)))(qs, k)

    for a, b in zip(per_example_grads(fj.dot_product_attention), per_example_grads(jax.nn.dot_product_attention)):
        assert a.shape == b.shape and rel_error(a, b) < TOL


def test_vmap_with_bias():
    require("bias")
    rng = np.random.default_rng(6)
    q, k, v = qkv(rng, 1, 6, 7, 2, 2, 8)
    qs = uniform(rng, (3,) + q.shape)
    bias = rng.normal(size=(1, 2, 6, 7)).astype(np.float32)
    biases = rng.normal(size=(3, 1, 1, 6, 7)).astype(np.float32)

    def grads(impl, bias, in_axes):
        f = lambda q, b: jnp.sum(impl(q, k, v, b) ** 2)  # noqa: E731
        return jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1)), in_axes=in_axes))(qs, bias)

    for b, axes in ((bias, (0, None)), (biases, (0, 0))):
        for x, y in zip(grads(fj.dot_product_attention, b, axes), grads(jax.nn.dot_product_attention, b, axes)):
            assert x.shape == y.shape and rel_error(x, y) < TOL


def test_vmap_folds_or_loops_over_masked_batches():
    """Both paths of the handlers: leading dims folded into the batch (every
    operand batched) and one call per leading index (the mask broadcasts)."""
    require("bias", "mask", "kv_lengths")
    rng = np.random.default_rng(12)
    for B, mask_axis in ((1, 0), (2, None)):
        q, k, v = uniform(rng, (3, B, 6, 4, 8)), uniform(rng, (3, B, 7, 2, 8)), uniform(rng, (3, B, 7, 2, 8))
        bias = uniform(rng, (3, 1, 4, 6, 7))
        mask = rng.uniform(size=(3, B, 1, 6, 7)) > 0.3
        mask[..., 0] = True
        lengths = np.array([[7] * B, [5] * B, [3] * B], np.int32)
        if mask_axis is None:
            mask = mask[0]
        axes = (0, 0, 0, 0, mask_axis, 0)

        def grads(impl):
            def loss(q, k, v, b, m, lengths):
                return jnp.sum(impl(q, k, v, b, m, key_value_seq_lengths=lengths) ** 2)
            return jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=axes))(q, k, v, bias, mask,
                                                                                          lengths)

        for x, y in zip(grads(fj.dot_product_attention), grads(jax.nn.dot_product_attention)):
            assert x.shape == y.shape and rel_error(x, y) < TOL


def test_bias_gradient_only_when_asked():
    require("bias")
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng, 1, 4, 4, 2, 2, 8)
    bias = np.zeros((1, 2, 4, 4), np.float32)
    text = str(jax.make_jaxpr(jax.grad(lambda q, b: fj.dot_product_attention(q, k, v, b).sum()))(q, bias))
    assert "grads', np.int64(0)" in text or "grads=0" in text
    text = str(jax.make_jaxpr(jax.grad(lambda q, b: fj.dot_product_attention(q, k, v, b).sum(), argnums=1))(q, bias))
    assert "grads', np.int64(1)" in text or "grads=1" in text


def test_bfloat16():
    require("bfloat16")
    rng = np.random.default_rng(8)
    q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in qkv(rng, 2, 16, 16, 4, 2, 16))
    out = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    assert out.dtype == jnp.bfloat16
    ref = reference(*(np.asarray(x, np.float32) for x in (q, k, v)), is_causal=True)
    assert rel_error(np.asarray(out, np.float32), ref["o"]) < 2e-2

    def grad(impl):
        return jax.jit(jax.grad(lambda q: jnp.sum(impl(q, k, v).astype(jnp.float32))))(q)

    g, g_ref = grad(fj.dot_product_attention), grad(jax.nn.dot_product_attention)
    assert g.dtype == jnp.bfloat16
    assert rel_error(np.asarray(g, np.float32), np.asarray(g_ref, np.float32)) < 5e-2


def test_errors():
    rng = np.random.default_rng(9)
    q, k, v = qkv(rng, 2, 4, 5, 4, 2, 8)
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, uniform(rng, (2, 5, 3, 8)), uniform(rng, (2, 5, 3, 8)))
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, k, v, mask=np.ones((2, 4, 4, 5), np.float32))
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, k, v, bias=np.zeros((3, 4, 4, 5), np.float32))
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, k, v, key_value_seq_lengths=np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        fj.dot_product_attention(q, k, v, implementation="magic")
    with pytest.raises(TypeError):
        fj.dot_product_attention(q.astype(np.int32), k.astype(np.int32), v.astype(np.int32))
    # A request the C library refuses is an FmhaError while tracing, with the C message.
    big = uniform(rng, (1, 4, 2, 600))
    with pytest.raises(FmhaError, match="FMHA_ERR_BAD_HEAD_DIM"):
        fj.dot_product_attention(big, big, big)


def test_runtime_c_error_carries_the_message():
    """A value the library refuses while the call runs (a page index past the
    pools) fails with the status and the library's detail naming it."""
    require("kv_lengths")
    from conftest import paged_case

    c = paged_case(10, 2, 4, 2, 4)
    bad = np.array(c["table"])
    bad[0, 0] = c["k"].shape[0]
    f = jax.jit(lambda t: fj.dot_product_attention(c["q"], c["k"], c["v"], block_table=t,
                                                   key_value_seq_lengths=c["lengths"]))
    with pytest.raises(Exception, match="FMHA_ERR_BAD_PAGE") as info:
        jax.block_until_ready(f(bad))
    assert "fmha_forward" in str(info.value) and "block_table[0][0] must lie in 0..num_pages - 1" in str(info.value)


def test_lengths_past_the_sequence_clamp_as_jax_nn():
    """jax.nn takes lengths past T or S as all of it: so does fmha.jax."""
    require("kv_lengths")
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, 2, 4, 5, 2, 2, 8)
    f = jax.jit(lambda n: fj.dot_product_attention(q, k, v, key_value_seq_lengths=n))
    g = jax.jit(lambda n: jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=n))
    got, want = f(jnp.array([9, 2], jnp.int32)), g(jnp.array([9, 2], jnp.int32))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(jnp.array([5, 2], jnp.int32))))


# Rows that see no key, as jax.nn computes them: the mean of every value
# (masks, windows, lengths; GQA), zeros past a query length, dV gaining dO /
# S; the residual jax.nn's masked score. A paged cache keeps zeros.
@pytest.mark.parametrize("case", ["mask", "window", "q_lengths", "kv_lengths_and_window", "bfloat16"])
def test_rows_that_see_no_key_follow_jax_nn(case):
    require("window")
    rng = np.random.default_rng(len(case))
    dtype = jnp.bfloat16 if case == "bfloat16" else np.float32
    q, k, v = qkv(rng, 2, 16, 5, 4, 2, 16, dtype)
    mask = jnp.asarray(rng.random((2, 1, 16, 5)) > 0.6)
    kw = {"mask": dict(mask=mask), "window": dict(local_window_size=(4, 0)),
          "q_lengths": dict(mask=mask, query_seq_lengths=jnp.asarray([10, 16], jnp.int32)),
          "kv_lengths_and_window": dict(key_value_seq_lengths=jnp.asarray([3, 5], jnp.int32),
                                        local_window_size=(2, 2)),
          "bfloat16": dict(mask=mask)}[case]
    if case == "bfloat16":
        out = np.asarray(fj.dot_product_attention(q, k, v, **kw), np.float32)
        want = np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw), np.float32)
        assert rel_error(out, want) < 1e-2
        return
    seen = np.asarray(jax.nn.dot_product_attention(q, k, v, implementation="xla", return_residual=True, **kw)[1])
    assert (seen < -1e38).any()  # the case has such rows
    compare_with_jax(q, k, v, **kw)
    _, lse = fj.dot_product_attention(q, k, v, return_residual=True, **kw)
    _, want = jax.nn.dot_product_attention(q, k, v, implementation="xla", return_residual=True, **kw)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(want), rtol=1e-6, atol=1e-5)


def test_implementation_xla_passes_through():
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, 1, 5, 5, 2, 2, 8)
    f = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, implementation="xla"))
    g = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"))
    np.testing.assert_array_equal(f(q, k, v), g(q, k, v))
    assert "fmha_forward" not in str(jax.make_jaxpr(f)(q, k, v))


def test_ffi_library_is_cached():
    path = fj.ffi_library_path()
    assert os.path.isfile(path) and path.endswith(".so")
    assert fj._build() == path


def test_import_fmha_without_jax():
    code = ("import sys; sys.modules['jax'] = None\n"
            "import fmha, fmha.api\n"
            "try:\n    import fmha.jax\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ImportError: fmha.jax needs JAX" in proc.stdout


def test_bench_peers_rows_and_append(tmp_path, capsys):
    from fmha.tools import bench_peers

    out = tmp_path / "results.json"
    out.write_text('{"device": {"cpu": "from fmha-bench"}, "config": {"impls": "fmha_auto"}, '
                   '"results": [{"impl": "fmha_auto", "status": "ok"}], "configs": [], "note": "kept"}')
    small = ["--seqs", "16", "--heads", "2", "--dims", "8", "--min-samples", "2", "--min-sample-ms", "0",
             "--out", str(out), "--append"]
    assert bench_peers.main(small + ["--variants", "plain,masked_bias", "--modes", "fwd,fwdbwd",
                                     "--impls", "jax_xla,fmha_jax,torch_sdpa"]) == 0
    import json

    doc = json.loads(out.read_text())
    assert doc["device"]["cpu"] == "from fmha-bench" and doc["device"]["jax"] == jax.__version__
    assert doc["note"] == "kept" and len(doc["configs"]) == 2
    rows = doc["results"][1:]
    assert len(rows) == 2 * 2 * 3
    keys = {"impl", "mode", "variant", "dtype", "batch", "seq", "heads", "head_dim", "compile_s", "inner",
            "median_ms", "q1_ms", "q3_ms", "rel_err", "temp_mb", "arg_mb", "out_mb", "gflops", "status"}
    for row in rows:
        if row["impl"] == "torch_sdpa" and row["status"] == "unavailable":
            assert "torch" in row["error"]
            continue
        if row["impl"] == "fmha_jax" and row["variant"] == "masked_bias" and row["status"] == "unsupported":
            continue  # the C library does not serve masks and biases yet
        assert row["status"] == "ok", row
        assert keys <= set(row)
        assert row["rel_err"] < 1e-5 and row["q1_ms"] <= row["median_ms"] <= row["q3_ms"]
    with pytest.raises(SystemExit) as info:
        bench_peers.main(["--bogus"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        bench_peers.main(["--impls", "jax_xla,nope"])
    assert info.value.code == 2
    capsys.readouterr()


def test_bench_peers_decode_and_gqa_rows(tmp_path, capsys):
    """--seq-q and --heads-kv: rows carry them and a K/V GB/s figure, causal
    is bottom-right (every impl agrees with the float64 reference), and the
    flop count is fmha-bench's (per query under bottom-right)."""
    from fmha.tools import bench_peers

    out = tmp_path / "results.json"
    assert bench_peers.main(["--seqs", "24", "--seq-q", "3", "--heads", "4", "--heads-kv", "2", "--dims", "8",
                             "--variants", "plain,causal,masked_bias", "--modes", "fwd,fwdbwd",
                             "--impls", "jax_xla,fmha_jax,torch_sdpa,openvino_sdpa", "--min-samples", "2",
                             "--min-sample-ms", "0", "--out", str(out)]) == 0
    import json

    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 4 * 2 * 3
    for row in rows:
        if row["impl"] == "torch_sdpa" and row["status"] == "unavailable":
            continue
        if row["impl"] == "openvino_sdpa" and row["status"] == "unavailable":
            # inference only; or the package is absent
            assert row["mode"] == "fwdbwd" and "no backward" in row["error"] or "openvino" in row["error"], row
            continue
        assert row["status"] == "ok", row
        assert row["seq_q"] == 3 and row["heads_kv"] == 2 and row["seq"] == 24
        assert row["rel_err"] < 1e-5, row
        assert row["kv_gbs"] > 0
        # K and V are [1, 24, 2, 8] float32; queries see 22, 23, 24 keys when causal
        kv_bytes = 2 * 24 * 2 * 8 * 4
        assert row["kv_gbs"] == pytest.approx(kv_bytes / 1e9 / (row["median_ms"] * 1e-3), rel=1e-9)
        pairs = (22 + 23 + 24) if row["variant"] == "causal" else 3 * 24
        flops = 4 * 4 * pairs * 8 * (3.5 if row["mode"] == "fwdbwd" else 1)
        assert row["gflops"] == pytest.approx(flops / 1e9 / (row["median_ms"] * 1e-3), rel=1e-9)
    with pytest.raises(SystemExit) as info:
        bench_peers.main(["--heads", "4", "--heads-kv", "3"])
    assert info.value.code == 2
    capsys.readouterr()


def test_bench_peers_inputs_follow_fmha_bench():
    from fmha.tools import bench_peers

    # fmha-bench's first draws from seed 0x5eed5eed (splitmix64, 24-bit uniform in [-1, 1))
    first = bench_peers.Stream(bench_peers.INPUT_SEED).uniform(3)
    np.testing.assert_array_equal(first, np.array([0.200319767, 0.969508171, -0.108368039], np.float32))


def test_zero_scale_gives_equal_weights():
    """scale=0.0 is a zero scale under jit too (XLA's threads treat
    subnormals as zero, so no tiny stand-in would do): O averages the
    visible values, and dQ is exactly zero."""
    rng = np.random.default_rng(21)
    q, k, v = qkv(rng, 1, 4, 6, 2, 2, 16)
    q, k = 4 * q, 4 * k
    for run in (fj.dot_product_attention, jax.jit(fj.dot_product_attention, static_argnames=("scale", "is_causal"))):
        out = np.asarray(run(q, k, v, scale=0.0))
        assert rel_error(out, np.broadcast_to(v.astype(np.float64).mean(1, keepdims=True), out.shape)) < TOL
        ref = reference(q, k, v, scale=0.0, is_causal=True)
        assert rel_error(np.asarray(run(q, k, v, scale=0.0, is_causal=True)), ref["o"]) < TOL
    dq = jax.jit(jax.grad(lambda q: (fj.dot_product_attention(q, k, v, scale=0.0) ** 2).sum()))(q)
    assert not np.asarray(dq).any()


def test_traced_scale_and_its_gradient():
    """A scale traced under jit (a learned temperature) runs, and gets the
    gradient jax.nn gives it."""
    rng = np.random.default_rng(22)
    q, k, v = qkv(rng, 2, 5, 7, 4, 2, 16)

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda s, q: (fn(q, k, v, scale=s, is_causal=True) ** 2).sum(),
                                          argnums=(0, 1)))

    (val, (d_s, d_q)) = loss(fj.dot_product_attention)(0.7, q)
    (val_x, (d_s_x, d_q_x)) = loss(jax.nn.dot_product_attention)(0.7, q)
    ref = reference(q, k, v, scale=0.7, is_causal=True)
    assert abs(float(val) - float((ref["o"] ** 2).sum())) < TOL * float(val)
    assert abs(float(d_s) - float(d_s_x)) < 1e-4 * abs(float(d_s_x))
    assert rel_error(np.asarray(d_q), np.asarray(d_q_x)) < TOL


@pytest.mark.parametrize("q_shape, kv_shape", [((0, 4, 2, 8), (0, 6, 2, 8)), ((1, 0, 2, 8), (1, 6, 2, 8)),
                                               ((1, 4, 2, 8), (1, 0, 2, 8)), ((4, 0, 8), (6, 0, 8))])
def test_empty_dims(q_shape, kv_shape):
    """An empty dim gives an empty output, S = 0 zeros (rows that see no
    key), with zero gradients."""
    q, kv = jnp.ones(q_shape), jnp.ones(kv_shape)
    out = fj.dot_product_attention(q, kv, kv)
    assert out.shape == q_shape[:-1] + kv_shape[-1:]
    assert not np.asarray(out).any()
    dq = jax.grad(lambda q: fj.dot_product_attention(q, kv, kv).sum())(q)
    assert dq.shape == q.shape and not np.asarray(dq).any()


@pytest.mark.parametrize("T, S", [(4, 13), (13, 5)])
def test_bottom_right_window_and_alibi_without_causal(T, S):
    """causal_alignment='bottom_right' without is_causal places the window
    and ALiBi at i + S - T against j (FlashAttention's rule), under jit and
    grad."""
    require("window")
    rng = np.random.default_rng(T + S)
    q, k, v = qkv(rng, 2, T, S, 4, 2, 16)
    d_o = uniform(rng, (2, T, 4, 16))
    slopes = np.array([0.2, 0.5, 0.05, 1.0], np.float32)
    kw = dict(causal_alignment="bottom_right", local_window_size=(3, 1), alibi_slopes=slopes)
    out, grads = output_and_grads(fj.dot_product_attention, q, k, v, None, d_o, **kw)
    ref = reference(q, k, v, d_out=d_o, causal_alignment="bottom_right", window=(3, 1), alibi=slopes)
    assert rel_error(out, ref["o"]) < TOL
    for got, name in zip(grads, ("dq", "dk", "dv")):
        assert rel_error(got, ref[name]) < TOL, name


# A float32 call that names no precision takes JAX's matmul precision:
# 'high' (and 'BF16_BF16_F32_X3') as bf16x3, 'bfloat16' as bf16, the
# default as fast: the same bits as naming that precision.
@pytest.mark.parametrize("setting, precision", [("high", "bf16x3"), ("BF16_BF16_F32_X3", "bf16x3"),
                                                 ("bfloat16", "bf16"), (None, "fast")])
def test_default_matmul_precision_picks_the_float32_precision(setting, precision):
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(uniform(rng, (1, 200, 2, 32))) for _ in range(3))
    named = np.asarray(fj.dot_product_attention(q, k, v, is_causal=True, precision=precision))
    with jax.default_matmul_precision(setting):
        taken = np.asarray(jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, is_causal=True))(q, k, v))
    np.testing.assert_array_equal(taken, named)
    # a bf16 query keeps fast whatever the setting
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    with jax.default_matmul_precision(setting):
        got = fj.dot_product_attention(qb, kb, vb, is_causal=True)
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(fj.dot_product_attention(qb, kb, vb, is_causal=True, precision="fast"),
                                             np.float32))
