"""Quantized KV caches through NumPy fmha.attention (key_format=,
value_format=, key_scales=, value_scales=) and fmha.quantize_kv, against the
float64 reference on the values the caches hold, decoded here independently
(ml_dtypes for float8, NumPy for int8 and the GGUF blocks): precision
'accurate' (the float32 query) to float32's rounding, 'fast' (the query
quantized as q8_0 for integer scores of 8-bit and 4-bit keys) to no more
than llama.cpp's arithmetic adds. Paged caches, GQA, MLA's latent head with
V a view of K, bf16 queries, and the clear errors of bad formats, shapes
and scales."""
import numpy as np
import pytest

import fmha
from fmha import _lib
from conftest import reference, rel_error, uniform

ml_dtypes = pytest.importorskip("ml_dtypes", reason="float8 and bfloat16 arrays need ml_dtypes")

FORMATS = ["int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"]
FP8 = {"fp8_e4m3": ml_dtypes.float8_e4m3fn, "fp8_e5m2": ml_dtypes.float8_e5m2}


def decode(values, scales, fmt, H):
    """The float64 values a stored cache holds ([..., K, H])."""
    if fmt == "int8":
        return values.astype(np.float64) * scales[..., None]
    if fmt in FP8:
        return values.view(FP8[fmt]).astype(np.float64) * scales[:, None]
    nbytes = 34 if fmt == "q8_0" else 18
    blocks = values.reshape(*values.shape[:-1], H // 32, nbytes)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
    if fmt == "q8_0":
        q = blocks[..., 2:].view(np.int8).astype(np.float32)
    else:
        b = blocks[..., 2:]
        q = np.concatenate([b & 15, b >> 4], axis=-1).astype(np.float32) - 8
    return (q * d).astype(np.float64).reshape(*values.shape[:-1], H)  # d * q in float32, as ggml


def stored(rng, shape, fmt):
    x = uniform(rng, shape)
    x.reshape(-1)[3] = 5.0  # an outlier the scales must carry
    values, scales = fmha.quantize_kv(x, fmt)
    return x, values, scales


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T,N,K,S,H,Hv", [(1, 8, 2, 300, 64, 64), (4, 32, 8, 200, 32, 64), (40, 4, 2, 60, 64, 32)])
def test_format_matches_reference(fmt, T, N, K, S, H, Hv):
    rng = np.random.default_rng(hash((fmt, T)) % 2**32)
    B = 2
    q = uniform(rng, (B, T, N, H))
    _, kq, ks = stored(rng, (B, S, K, H), fmt)
    _, vq, vs = stored(rng, (B, S, K, Hv), fmt)
    lengths = np.array([S, S // 3], np.int32)
    out, lse = fmha.attention(q, kq, vq, key_format=fmt, value_format=fmt, key_scales=ks, value_scales=vs,
                              key_value_seq_lengths=lengths, is_causal=True, causal_alignment="bottom_right",
                              return_lse=True, precision="accurate")
    ref = reference(q, decode(kq, ks, fmt, H), decode(vq, vs, fmt, Hv), kv_lengths=lengths, is_causal=True,
                    causal_alignment="bottom_right")
    assert out.shape == (B, T, N, Hv) and out.dtype == np.float32
    assert rel_error(out, ref["o"]) < 2e-5
    seen = np.isfinite(ref["lse"])
    assert np.max(np.abs(lse[seen] - ref["lse"][seen])) < 1e-4


def pool_of(x, table, lengths, page):
    """A page pool [P, page, ...] of a cache x [B, S, ...] through table (unused rows 0xff bytes)."""
    P = int(table.max()) + 2
    pool = np.zeros((P, page) + x.shape[2:], x.dtype)
    pool.view(np.uint8)[...] = 0xFF
    for b in range(x.shape[0]):
        for j in range(int(lengths[b])):
            pool[table[b, j // page], j % page] = x[b, j]
    return pool


def llama_q8_0(x):
    """x [..., H] as llama.cpp's arithmetic sees a query: blocks of 32
    quantized as ggml's q8_0 (d = max |x| / 127 rounded to a half, q =
    round(x / d) half away from zero), dequantized in float64."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    d = np.max(np.abs(blocks), axis=-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    y = blocks * inv
    q = np.trunc(y) + np.where(np.abs(y - np.trunc(y)) >= 0.5, np.sign(y), 0)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


@pytest.mark.parametrize("fmt", ["int8", "q8_0", "q4_0"])
@pytest.mark.parametrize("T,N,K,S,H", [(1, 8, 2, 300, 64), (4, 32, 8, 200, 32)])
def test_fast_integer_scores_no_worse_than_llama_cpp(fmt, T, N, K, S, H):
    rng = np.random.default_rng(hash((fmt, T, 1)) % 2**32)
    B = 2
    q = uniform(rng, (B, T, N, H))
    _, kq, ks = stored(rng, (B, S, K, H), fmt)
    _, vq, vs = stored(rng, (B, S, K, H), fmt)
    lengths = np.array([S, S // 3], np.int32)
    common = dict(key_format=fmt, value_format=fmt, key_scales=ks, value_scales=vs, key_value_seq_lengths=lengths,
                  is_causal=True, causal_alignment="bottom_right")
    assert "scores=integer" in fmha.describe(q, kq, vq, **common)
    assert "scores=float32" in fmha.describe(q, kq, vq, precision="accurate", **common)
    out = fmha.attention(q, kq, vq, **common)
    kd, vd = decode(kq, ks, fmt, H), decode(vq, vs, fmt, H)
    ref = reference(q, kd, vd, kv_lengths=lengths, is_causal=True, causal_alignment="bottom_right")["o"]
    llama = reference(llama_q8_0(q), kd, vd, kv_lengths=lengths, is_causal=True, causal_alignment="bottom_right")["o"]
    assert rel_error(out, ref) <= 1.25 * rel_error(llama, ref)
    assert rel_error(out, ref) < 1e-2


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("page", [1, 16, 5])
def test_paged_format_gives_the_contiguous_bits(fmt, page):
    rng = np.random.default_rng(page)
    B, S, K, N, H, T = 3, 150, 2, 8, 64, 2
    q = uniform(rng, (B, T, N, H))
    _, kq, ks = stored(rng, (B, S, K, H), fmt)
    _, vq, vs = stored(rng, (B, S, K, H), fmt)
    lengths = np.array([S, 77, 1], np.int32)
    max_pages = -(-S // page)
    order = rng.permutation(B * max_pages)
    table = order.reshape(B, max_pages).astype(np.int32)
    common = dict(key_format=fmt, value_format=fmt, key_value_seq_lengths=lengths, is_causal=True,
                  causal_alignment="bottom_right")
    want = fmha.attention(q, kq, vq, key_scales=ks, value_scales=vs, **common)
    kp, vp = pool_of(kq, table, lengths, page), pool_of(vq, table, lengths, page)
    if fmt == "int8":  # the scales live in pools beside the values
        ksp, vsp = pool_of(ks, table, lengths, page), pool_of(vs, table, lengths, page)
    else:
        ksp, vsp = ks, vs
    got = fmha.attention(q, kp, vp, key_scales=ksp, value_scales=vsp, block_table=table, **common)
    assert np.array_equal(got, want)


def test_mixed_formats_float8_arrays_and_bf16_query():
    rng = np.random.default_rng(5)
    B, S, K, N, H = 2, 200, 2, 4, 64
    q = uniform(rng, (B, 1, N, H)).astype(ml_dtypes.bfloat16)
    _, kq, ks = stored(rng, (B, S, K, H), "q8_0")
    _, vq, vs = stored(rng, (B, S, K, H), "fp8_e4m3")
    out = fmha.attention(q, kq, vq.view(ml_dtypes.float8_e4m3fn), key_format="q8_0", value_format="fp8_e4m3",
                         value_scales=vs, precision="accurate")
    ref = reference(q.astype(np.float32), decode(kq, None, "q8_0", H), decode(vq, vs, "fp8_e4m3", H))
    assert out.dtype == q.dtype
    assert rel_error(out.astype(np.float32), ref["o"]) < 8e-3  # O rounded to bf16
    # one side quantized, the other float32
    v32 = uniform(rng, (B, S, K, H))
    out = fmha.attention(q.astype(np.float32), kq, v32, key_format="q8_0", precision="accurate")
    ref = reference(q.astype(np.float32), decode(kq, None, "q8_0", H), v32)
    assert rel_error(out, ref["o"]) < 2e-5


@pytest.mark.parametrize("fmt", ["q8_0", "int8", "fp8_e4m3"])
def test_mla_latent_head_with_value_a_view_of_key(fmt):
    rng = np.random.default_rng(9)
    B, S, N, D, Dv = 1, 300, 16, 576, 512
    q = uniform(rng, (B, 2, N, D))
    _, kq, ks = stored(rng, (B, S, 1, D), fmt)
    units = Dv // 32 * 34 if fmt == "q8_0" else Dv
    v_view = kq[..., :units]  # the first 512 columns of the latent rows, the same memory
    assert np.shares_memory(v_view, kq)
    out = fmha.attention(q, kq, v_view, key_format=fmt, value_format=fmt, key_scales=ks, value_scales=ks,
                         scale=0.05, is_causal=True, causal_alignment="bottom_right", precision="accurate")
    kd = decode(kq, ks, fmt, D)
    ref = reference(q, kd, kd[..., :Dv], scale=0.05, is_causal=True, causal_alignment="bottom_right")
    assert rel_error(out, ref["o"]) < 2e-5
    assert "driver=decode" in fmha.describe(q, kq, v_view, key_format=fmt, value_format=fmt, key_scales=ks,
                                            value_scales=ks)


def test_quantize_kv_forms_and_rules():
    rng = np.random.default_rng(2)
    x = uniform(rng, (2, 10, 3, 64)) * 4
    for fmt, vshape, sshape in (("int8", (2, 10, 3, 64), (2, 10, 3)), ("fp8_e4m3", (2, 10, 3, 64), (3,)),
                                ("fp8_e5m2", (2, 10, 3, 64), (3,)), ("q8_0", (2, 10, 3, 68), None),
                                ("q4_0", (2, 10, 3, 36), None)):
        values, scales = fmha.quantize_kv(x, fmt)
        assert values.shape == vshape and (scales is None if sshape is None else scales.shape == sshape)
    # int8: scale = max|x| / 127 per row, q = round(x / scale)
    values, scales = fmha.quantize_kv(x, "int8")
    np.testing.assert_array_equal(scales, np.abs(x).max(-1) / np.float32(127))
    assert np.max(np.abs(values * scales[..., None] - x)) <= np.max(scales) / 2 * 1.0001
    # fp8: the nearest float8 (ml_dtypes rounds to nearest even too) for values in range
    for fmt, t in FP8.items():
        values, scales = fmha.quantize_kv(x, fmt, scales=np.ones(3, np.float32))
        np.testing.assert_array_equal(values, x.astype(t).view(np.uint8))
        # a head's scale of 0, which attention takes too: that head holds only 0
        values, _ = fmha.quantize_kv(x, fmt, scales=np.array([1, 0, 1], np.float32))
        assert np.all(values[..., 1, :].view(t).astype(np.float32) == 0)
        # a refused scale's message names the cache's scales, not the softmax scale
        with pytest.raises(fmha.FmhaError, match=r"scales\[token 0, head 2\] must be finite and >= 0") as e:
            fmha.quantize_kv(x, fmt, scales=np.array([1, 1, -1], np.float32))
        assert "sqrt" not in str(e.value)
    # GGUF q8_0: half a step of the block's scale d, plus the step's own
    # rounding to half (ggml divides by the float32 d, stores it as f16: up
    # to 127 x 2^-11 d more)
    values, _ = fmha.quantize_kv(x, "q8_0")
    d = values.reshape(2, 10, 3, 2, 34)[..., :2].copy().view(np.float16).astype(np.float64)
    err = np.abs(decode(values, None, "q8_0", 64) - x).reshape(2, 10, 3, 2, 32)
    assert np.all(err <= d * (0.5 + 127 * 2.0**-11) * 1.01)


def test_bad_formats_are_clear_errors():
    rng = np.random.default_rng(3)
    B, S, K, N, H = 1, 40, 2, 4, 64
    q = uniform(rng, (B, 1, N, H))
    _, kq, ks = stored(rng, (B, S, K, H), "int8")
    _, vq, _ = stored(rng, (B, S, K, H), "q8_0")
    ok = dict(key_format="int8", value_format="q8_0", key_scales=ks)
    fmha.attention(q, kq, vq, **ok)
    with pytest.raises(ValueError, match="key_format must be one of"):
        fmha.attention(q, kq, vq, **{**ok, "key_format": "int4"})
    with pytest.raises(TypeError, match="int8 array"):
        fmha.attention(q, kq.view(np.uint8), vq, **ok)
    with pytest.raises(ValueError, match="key_scales must be given"):
        fmha.attention(q, kq, vq, **{**ok, "key_scales": None})
    with pytest.raises(ValueError, match=r"key_scales of format 'int8' must have shape \(1, 40, 2\)"):
        fmha.attention(q, kq, vq, **{**ok, "key_scales": ks[:, :20]})
    with pytest.raises(ValueError, match="value_scales must be None for q8_0"):
        fmha.attention(q, kq, vq, **{**ok, "value_scales": ks})
    with pytest.raises(ValueError, match="multiple of 34"):
        fmha.attention(q, kq, vq[..., :40], **ok)
    with pytest.raises(ValueError, match="need key_format"):
        fmha.attention(q, q, q, key_scales=ks)
    bad = ks.copy()
    bad[0, 7, 1] = -1.0
    with pytest.raises(fmha.FmhaError, match="k_scales of batch element 0, key 7, kv head 1") as e:
        fmha.attention(q, kq, vq, **{**ok, "key_scales": bad})
    assert e.value.status == _lib.ERR_BAD_SCALE
    with pytest.raises(fmha.FmhaError):
        fmha.attention_backward(q, kq, vq, q, np.zeros((B, N, 1), np.float32), q, **ok)
    with pytest.raises(ValueError, match="format must be one of"):
        fmha.quantize_kv(q, "int4")
    with pytest.raises(ValueError, match="multiple of 32"):
        fmha.quantize_kv(q[..., :48], "q4_0")
    with pytest.raises(ValueError, match="keeps its scales in its blocks"):
        fmha.quantize_kv(q, "q8_0", scales=np.ones(4, np.float32))


# ---- the JAX and torch bindings (forward only, through the NumPy binding) ----


@pytest.mark.parametrize("fmt", FORMATS)
def test_jax_quantized_cache_matches_numpy(fmt):
    jax = pytest.importorskip("jax", reason="the JAX binding needs jax")
    import jax.numpy as jnp
    import fmha.jax as fj

    rng = np.random.default_rng(11)
    B, S, K, N, H = 2, 120, 2, 8, 64
    q = uniform(rng, (B, 1, N, H))
    _, kq, ks = stored(rng, (B, S, K, H), fmt)
    _, vq, vs = stored(rng, (B, S, K, H), fmt)
    lengths = np.array([S, 50], np.int32)
    kw = dict(key_format=fmt, value_format=fmt, key_value_seq_lengths=lengths, is_causal=True,
              causal_alignment="bottom_right")
    want = fmha.attention(q, kq, vq, key_scales=ks, value_scales=vs, **kw)
    scales = tuple(None if x is None else jnp.asarray(x) for x in (ks, vs))
    got = jax.jit(lambda q, k, v, ks, vs: fj.dot_product_attention(q, k, v, key_scales=ks, value_scales=vs, **kw))(
        jnp.asarray(q), jnp.asarray(kq), jnp.asarray(vq), *scales)
    assert np.array_equal(np.asarray(got), want)
    for precision in ("accurate", "bf16"):  # the precision reaches the library
        want_p = fmha.attention(q, kq, vq, key_scales=ks, value_scales=vs, precision=precision, **kw)
        got_p = fj.dot_product_attention(jnp.asarray(q), jnp.asarray(kq), jnp.asarray(vq), key_scales=scales[0],
                                         value_scales=scales[1], precision=precision, **kw)
        assert np.array_equal(np.asarray(got_p), want_p), precision
    with pytest.raises(fmha.FmhaError, match="forward only"):
        jax.grad(lambda q: fj.dot_product_attention(q, jnp.asarray(kq), jnp.asarray(vq), key_scales=scales[0],
                                                    value_scales=scales[1], **kw).sum())(jnp.asarray(q))
    blocks = jnp.zeros((B, S, K, 30), jnp.uint8)  # not a whole number of 34-byte blocks
    with pytest.raises(ValueError, match="multiple of 34"):
        fj.dot_product_attention(jnp.asarray(q), blocks, blocks, key_format="q8_0", value_format="q8_0")
    values, sc = fj.quantize_kv(jnp.asarray(uniform(rng, (B, S, K, H))), fmt)
    assert values.shape[:3] == (B, S, K)


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_quantized_cache_matches_numpy(fmt):
    torch = pytest.importorskip("torch", reason="the torch binding needs PyTorch")
    import fmha.torch as ft

    rng = np.random.default_rng(12)
    B, S, K, N, H = 2, 120, 2, 8, 64
    q = torch.from_numpy(uniform(rng, (B, N, 1, H)))  # SDPA's [B, H, L, E]
    x = torch.from_numpy(uniform(rng, (B, K, S, H)))
    kq, ks = ft.quantize_kv(x, fmt)
    vq, vs = ft.quantize_kv(-x, fmt)
    assert kq.shape[:3] == (B, K, S) and (ks is None or ks.shape in ((B, K, S), (K,)))
    out = ft.scaled_dot_product_attention(q, kq, vq, enable_gqa=True, key_format=fmt, value_format=fmt,
                                          key_scales=ks, value_scales=vs)
    # the same cache through NumPy, in [B, S, K, ..] order
    def np_order(t, scales=False):
        if t is None:
            return None
        return (t.transpose(1, 2) if t.dim() == 4 or (scales and t.dim() == 3) else t).contiguous().numpy()
    want = fmha.attention(q.transpose(1, 2).numpy(), np_order(kq), np_order(vq), key_format=fmt, value_format=fmt,
                          key_scales=np_order(ks, True), value_scales=np_order(vs, True))
    assert torch.equal(out, torch.from_numpy(want).transpose(1, 2))
    for precision in ("accurate", "bf16"):  # the precision reaches the library
        got_p = ft.scaled_dot_product_attention(q, kq, vq, enable_gqa=True, key_format=fmt, value_format=fmt,
                                                key_scales=ks, value_scales=vs, precision=precision)
        want_p = fmha.attention(q.transpose(1, 2).numpy(), np_order(kq), np_order(vq), key_format=fmt,
                                value_format=fmt, key_scales=np_order(ks, True), value_scales=np_order(vs, True),
                                precision=precision)
        assert torch.equal(got_p, torch.from_numpy(want_p).transpose(1, 2)), precision
    with pytest.raises(fmha.FmhaError, match="forward only"):
        ft.scaled_dot_product_attention(q.requires_grad_(), kq, vq, enable_gqa=True, key_format=fmt,
                                        value_format=fmt, key_scales=ks, value_scales=vs)
