"""test_numpy_api: fmha.attention and fmha.attention_backward (NumPy) against
the float64 reference and jax.nn.dot_product_attention: shapes with tails,
GQA, causal alignments, every mask and bias, strided inputs, 16-bit dtypes,
callbacks, and the errors raised before and by the C library. Features the
C library does not serve yet are skipped with the reason."""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import fmha
from fmha import _lib
from fmha._lib import FmhaError

from conftest import check_paged, gather, paged_case, reference, rel_bucket, rel_error, require, uniform

F32_TOL = 2e-5


def inputs(rng, B, T, S, N, K, H, Hv=None, dtype=np.float32):
    Hv = H if Hv is None else Hv
    return (uniform(rng, (B, T, N, H), dtype), uniform(rng, (B, S, K, H), dtype), uniform(rng, (B, S, K, Hv), dtype),
            uniform(rng, (B, T, N, Hv), dtype))


def check_grads(options, ref_options, q, k, v, d_o, tol=F32_TOL, bias_keys=()):
    o, lse = fmha.attention(q, k, v, return_lse=True, **options)
    ref = reference(q, k, v, d_out=d_o, **ref_options)
    assert rel_error(o, ref["o"]) < tol
    finite = np.isfinite(ref["lse"])
    assert np.array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], ref["lse"][finite], rtol=1e-5, atol=1e-5)
    dq, dk, dv, grads = fmha.attention_backward(q, k, v, o, lse, d_o, return_bias_grads=True, **options)
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert got.shape == ref[name].shape
        assert rel_error(got, ref[name]) < tol, name
    for key, ref_key in bias_keys:
        assert grads[key].shape == ref[ref_key].shape
        assert rel_error(grads[key], ref[ref_key]) < tol, key
    return o


# ---- the ctypes mirror of fmha.h -------------------------------------------------------------

STRUCT_FIELDS = {
    "fmha_tile": ["batch", "head_q", "q0", "nq", "k0", "nk", "q_stride", "k_stride", "thread"],
    "fmha_mask_callback": ["classify", "fill", "ctx"],
    "fmha_bias_callback": ["fill", "accumulate_grad", "ctx"],
    "fmha_masks": ["window_left", "window_right", "kv_lengths", "q_lengths", "q_segment_ids", "kv_segment_ids",
                   "dense", "dense_strides", "callback"],
    "fmha_biases": ["dense", "dense_strides", "alibi_slopes", "rel_table", "rel_num_buckets", "rel_max_distance",
                    "rel_bidirectional", "softcap", "callback"],
    "fmha_param_grads": ["d_dense", "d_dense_strides", "d_alibi", "d_rel_table"],
    "fmha_problem": ["struct_size", "dtype", "batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "head_dim", "head_dim_v", "scale",
                     "causal", "strategy", "precision", "q_strides", "k_strides", "v_strides", "o_strides", "masks",
                     "biases", "sinks", "block_table", "block_table_stride", "page_size", "num_pages",
                     "dropout_p", "dropout_seed", "dropout_offset", "kv_dtype", "alignment", "k_format", "v_format",
                     "k_scales", "v_scales", "k_scale_strides", "v_scale_strides"],
}


def test_struct_mirror_matches_the_header(tmp_path):
    header = _lib.header_path()
    cc = shutil.which("cc") or shutil.which("gcc")
    if header is None or cc is None:
        pytest.skip("needs fmha.h and a C compiler")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "fmha.h"', "int main(void) {"]
    for struct, fields in STRUCT_FIELDS.items():
        lines.append(f'printf("{struct} %zu\\n", sizeof({struct}));')
        for f in fields:
            lines.append(f'printf("{struct}.{f} %zu\\n", offsetof({struct}, {f}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", os.path.dirname(header), str(src), "-o", str(exe)], check=True)
    c_layout = dict(line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                             check=True).stdout.splitlines())
    for struct, fields in STRUCT_FIELDS.items():
        cls = getattr(_lib, struct)
        assert ctypes.sizeof(cls) == int(c_layout[struct]), struct
        assert [name for name, _ in cls._fields_] == fields, f"{struct}: fields differ from fmha.h"
        for f in fields:
            assert getattr(cls, f).offset == int(c_layout[f"{struct}.{f}"]), f"{struct}.{f}"


def test_status_names_cover_the_library():
    lib = _lib.load()
    unknown = lib.fmha_status_string(len(_lib.STATUS_NAMES)).decode()
    assert unknown == "unknown fmha status code", "fmha.h has a status the Python mirror does not name"
    for code in range(len(_lib.STATUS_NAMES)):
        assert lib.fmha_status_string(code).decode() != unknown


def test_library_facts():
    assert fmha.version_string().count(".") == 2
    # the table in use is the one a plan runs (the registry names it, not this test)
    q = np.zeros((1, 128, 1, 8), np.float32)
    assert fmha.isa_name() and f" isa={fmha.isa_name()} " in fmha.describe(q, q, q)
    assert fmha.get_num_threads() >= 1


# ---- forward and backward ------------------------------------------------------------------

SHAPES = [  # B, T, S, N, K, H, Hv
    (1, 1, 1, 1, 1, 8, 8),
    (2, 17, 17, 4, 4, 16, 16),
    (1, 37, 53, 6, 2, 24, 24),      # tails, GQA
    (2, 64, 29, 4, 1, 8, 16),       # MQA, Dv != D, T > S
    (1, 70, 70, 2, 2, 64, 64),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference(shape, causal):
    B, T, S, N, K, H, Hv = shape
    rng = np.random.default_rng(sum(shape) + causal)
    q, k, v, d_o = inputs(rng, B, T, S, N, K, H, Hv)
    check_grads(dict(is_causal=causal), dict(is_causal=causal), q, k, v, d_o)


@pytest.mark.parametrize("strategy", ["auto", "tiled", "dense", "portable"])
def test_strategies_agree(strategy):
    rng = np.random.default_rng(5)
    q, k, v, d_o = inputs(rng, 1, 33, 41, 4, 2, 16)
    check_grads(dict(strategy=strategy, is_causal=True), dict(is_causal=True), q, k, v, d_o)


def test_bottom_right_causal():
    require("bottom_right")
    rng = np.random.default_rng(6)
    for T, S in ((9, 21), (21, 9)):
        q, k, v, d_o = inputs(rng, 2, T, S, 2, 2, 8)
        check_grads(dict(is_causal=True, causal_alignment="bottom_right"),
                    dict(is_causal=True, causal_alignment="bottom_right"), q, k, v, d_o)


def test_bottom_right_follows_each_sequences_lengths():
    """Ragged batch, several queries per sequence: query i of batch b sees key
    j iff j <= i + kv_len[b] - q_len[b] (the cache_seqlens convention)."""
    rng = np.random.default_rng(61)
    q, k, v, d_o = inputs(rng, 3, 6, 40, 4, 2, 16)
    lengths = dict(query_seq_lengths=np.array([6, 3, 1], np.int32),
                   key_value_seq_lengths=np.array([40, 17, 5], np.int32))
    ref_lengths = dict(q_lengths=lengths["query_seq_lengths"], kv_lengths=lengths["key_value_seq_lengths"])
    check_grads(dict(is_causal=True, causal_alignment="bottom_right", **lengths),
                dict(is_causal=True, causal_alignment="bottom_right", **ref_lengths), q, k, v, d_o)
    # batch 1's query 0 sees keys 0..14 of its 17 (off = 17 - 3 = 14)
    o = fmha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right", **lengths)
    alone = fmha.attention(q[1:2, :1], k[1:2, :15], v[1:2, :15])
    np.testing.assert_allclose(o[1, 0], alone[0, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("T, S, window, alibi, lengths", [
    (1, 200, (16, None), False, True),   # a decode step with a sliding window, no causal mask
    (2, 6, (1, 0), False, False),
    (2, 6, None, True, False),
    (9, 5, (2, 1), True, False),         # T > S
    (13, 70, (5, 3), True, True),
])
def test_bottom_right_windows_and_alibi_without_causal(T, S, window, alibi, lengths):
    """FlashAttention's rule: windows and ALiBi measure i + kv_len - q_len
    against j on every call, causal or not; causal_alignment='bottom_right'
    without is_causal gives it (fmha_problem.alignment)."""
    rng = np.random.default_rng(T * S)
    q, k, v, d_o = inputs(rng, 2, T, S, 4, 2, 16)
    opts, ref_opts = dict(causal_alignment="bottom_right"), dict(causal_alignment="bottom_right")
    if window is not None:
        opts["local_window_size"] = ref_opts["window"] = window
    if alibi:
        opts["alibi_slopes"] = ref_opts["alibi"] = np.array([0.3, 0.05, 0.7, 1.1], np.float32)
    if lengths:
        opts["query_seq_lengths"] = ref_opts["q_lengths"] = np.array([T, max(T - 1, 1)], np.int32)
        opts["key_value_seq_lengths"] = ref_opts["kv_lengths"] = np.array([S, S // 2], np.int32)
    check_grads(opts, ref_opts, q, k, v, d_o)
    if window is not None:  # FlashAttention's spelling of an unbounded side, -1, is None's
        spelled = tuple(-1 if w is None else w for w in window)
        np.testing.assert_array_equal(fmha.attention(q, k, v, **dict(opts, local_window_size=spelled)),
                                      fmha.attention(q, k, v, **opts))
    top_left = fmha.attention(q, k, v, **dict(opts, causal_alignment="top_left"))
    assert rel_error(fmha.attention(q, k, v, **opts), top_left) > 1e-3  # the alignment matters here


@pytest.mark.parametrize("case", ["plain", "causal_lengths", "decode", "gqa_8_1"])
def test_sinks_and_their_gradient(case):
    """Attention sinks in the forward (O, lse) and every gradient, d_sinks
    included, against the float64 reference; a row that sees no key gets
    O = 0 and lse = its sink."""
    rng = np.random.default_rng(["plain", "causal_lengths", "decode", "gqa_8_1"].index(case) + 70)
    B, T, S, N, K = {"plain": (2, 19, 23, 4, 4), "causal_lengths": (2, 12, 30, 4, 2), "decode": (2, 1, 300, 8, 2),
                     "gqa_8_1": (1, 5, 70, 8, 1)}[case]
    q, k, v, d_o = inputs(rng, B, T, S, N, K, 16)
    sinks = rng.uniform(-2, 2, N).astype(np.float32)
    options, ref_options = dict(sinks=sinks), dict(sinks=sinks)
    if case == "causal_lengths":
        kv = np.array([30, 0], np.int32)   # batch 1 sees no key at all
        options.update(is_causal=True, causal_alignment="bottom_right", key_value_seq_lengths=kv)
        ref_options.update(is_causal=True, causal_alignment="bottom_right", kv_lengths=kv)
    o = check_grads(options, ref_options, q, k, v, d_o, bias_keys=[("sinks", "d_sinks")])
    if case == "causal_lengths":
        _, lse = fmha.attention(q, k, v, return_lse=True, **options)
        assert np.all(o[1] == 0) and np.allclose(lse[1], sinks[:, None])
    # without sinks the gradient dict has no entry for them
    o2, lse2 = fmha.attention(q, k, v, return_lse=True)
    assert "sinks" not in fmha.attention_backward(q, k, v, o2, lse2, d_o, return_bias_grads=True)[3]


def test_sinks_errors():
    q, k, v, _ = inputs(np.random.default_rng(0), 1, 3, 5, 4, 2, 8)
    with pytest.raises(ValueError, match="sinks must have shape"):
        fmha.attention(q, k, v, sinks=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="sinks must be finite"):
        fmha.attention(q, k, v, sinks=np.array([0, np.nan, 0, 0], np.float32))


def dropout_factors(shape, p, seed, offset):
    """Z [B, N, T, S] of the C library's draw (fmha_dropout_keep), 0 or 1 / (1 - p)."""
    B, N, T, S = shape
    prob = _lib.problem_init(B, N, N, T, S, 8, 8)
    prob.dropout_p, prob.dropout_seed, prob.dropout_offset = p, seed, offset
    keep = _lib.load().fmha_dropout_keep
    z = np.array([keep(ctypes.byref(prob), b, n, i, j) for b in range(B) for n in range(N) for i in range(T)
                  for j in range(S)], np.float64).reshape(B, N, T, S)
    return z / (1.0 - np.float32(p).astype(np.float64))


@pytest.mark.parametrize("p", [0.1, 0.6])
def test_dropout_matches_the_reference_with_the_same_draw(p):
    rng = np.random.default_rng(int(p * 10))
    B, T, S, N, K = 2, 13, 21, 4, 2
    q, k, v, d_o = inputs(rng, B, T, S, N, K, 16)
    options = dict(dropout_p=p, dropout_seed=2**63 + 5, dropout_offset=1000, is_causal=True)
    z = dropout_factors((B, N, T, S), p, 2**63 + 5, 1000)
    check_grads(options, dict(is_causal=True, dropout=z), q, k, v, d_o)
    # the same arguments, the same bits; another seed, another draw
    o1 = fmha.attention(q, k, v, **options)
    assert np.array_equal(o1, fmha.attention(q, k, v, **options))
    assert not np.array_equal(o1, fmha.attention(q, k, v, **{**options, "dropout_seed": 6}))


def test_dropout_errors():
    q, k, v, _ = inputs(np.random.default_rng(0), 1, 3, 5, 2, 2, 8)
    for bad in (1.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="dropout_p must be in"):
            fmha.attention(q, k, v, dropout_p=bad)
    with pytest.raises(ValueError, match="dropout_seed must be an integer"):
        fmha.attention(q, k, v, dropout_p=0.1, dropout_seed=-1)


def test_merge_of_two_key_halves_is_attention_over_all():
    """fmha.merge (fmha_merge): attention over keys [0, s) and [s, S) merged by
    lse equals attention over all S keys; a side that saw no key adds nothing."""
    rng = np.random.default_rng(81)
    q, k, v, _ = inputs(rng, 2, 9, 30, 4, 2, 16)
    whole, whole_lse = fmha.attention(q, k, v, return_lse=True)
    a, a_lse = fmha.attention(q, k[:, :11], v[:, :11], return_lse=True)
    b, b_lse = fmha.attention(q, k[:, 11:], v[:, 11:], return_lse=True)
    out, lse = fmha.merge(a, a_lse, b, b_lse)
    assert rel_error(out, whole) < F32_TOL
    np.testing.assert_allclose(lse, whole_lse, rtol=1e-6, atol=1e-6)
    empty_lse = np.full_like(b_lse, -np.inf)
    out, lse = fmha.merge(a, a_lse, np.full_like(b, np.nan), empty_lse)   # its out is not read
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(lse, a_lse)
    out, lse = fmha.merge(a[0], a_lse[0], b[0], b_lse[0])                  # 3-D
    assert rel_error(out, whole[0]) < F32_TOL
    with pytest.raises(ValueError, match="lse_a and lse_b must have shape"):
        fmha.merge(a, a_lse[:, :2], b, b_lse)


def test_three_d_inputs_and_scale():
    rng = np.random.default_rng(7)
    q, k, v, d_o = (x[0] for x in inputs(rng, 1, 9, 11, 4, 2, 8))
    o, lse = fmha.attention(q, k, v, scale=0.3, return_lse=True)
    ref = reference(q[None], k[None], v[None], scale=0.3, d_out=d_o[None])
    assert o.shape == (9, 4, 8) and lse.shape == (4, 9)
    assert rel_error(o, ref["o"][0]) < F32_TOL
    dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, d_o, scale=0.3)
    assert rel_error(dq, ref["dq"][0]) < F32_TOL and rel_error(dk, ref["dk"][0]) < F32_TOL
    # scale 0 is uniform attention (the C API reserves 0 for the default scale)
    o0 = fmha.attention(q, k, v, scale=0.0)
    np.testing.assert_allclose(o0, np.repeat(v.mean(axis=0, keepdims=True), 2, axis=1).repeat(9, axis=0),
                               atol=1e-6)


def test_strided_and_broadcast_inputs_need_no_copies():
    rng = np.random.default_rng(8)
    B, T, S, N, H = 2, 12, 15, 4, 8
    q_bhsd = uniform(rng, (B, N, T, H))
    kv = uniform(rng, (B, S, 2, 1, H))
    q = q_bhsd.transpose(0, 2, 1, 3)                 # [B, T, N, H] view of a BHSD array
    k = np.broadcast_to(kv[:, :, 0], (B, S, N, H))   # zero head stride
    v = kv[:, :, 1, :, :][:, :, [0, 0, 0, 0]]         # a copy, fine
    v = v[:, ::-1][:, ::-1]                           # double reversal: positive strides again
    ref = reference(q, k, v)
    assert rel_error(fmha.attention(q, k, v), ref["o"]) < F32_TOL
    reversed_k = np.ascontiguousarray(k)[:, ::-1]     # negative strides are copied
    ref = reference(q, reversed_k, v)
    assert rel_error(fmha.attention(q, reversed_k, v), ref["o"]) < F32_TOL
    d_o = np.broadcast_to(np.float32(1.0), (B, T, N, H))  # e.g. the gradient of a sum
    o, lse = fmha.attention(q, k, v, return_lse=True)
    dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, d_o)
    ref = reference(q, k, v, d_out=d_o)
    assert rel_error(dq, ref["dq"]) < F32_TOL and rel_error(dv, ref["dv"]) < F32_TOL


def test_thread_counts_give_identical_results():
    rng = np.random.default_rng(9)
    q, k, v, _ = inputs(rng, 1, 40, 40, 4, 4, 16)
    before = fmha.get_num_threads()
    try:
        fmha.set_num_threads(1)
        one = fmha.attention(q, k, v)
        fmha.set_num_threads(3)
        three = fmha.attention(q, k, v)
    finally:
        fmha.set_num_threads(0)
    assert np.array_equal(one, three)
    assert fmha.get_num_threads() == before


# ---- masks -------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_shape", [(2, 4, 13, 19), (1, 1, 13, 19), (2, 1, 1, 19), (13, 19), (4, 1, 19)])
def test_dense_mask_broadcasts(mask_shape):
    require("mask")
    rng = np.random.default_rng(len(mask_shape))
    q, k, v, d_o = inputs(rng, 2, 13, 19, 4, 2, 8)
    mask = rng.uniform(size=mask_shape) > 0.4
    mask[..., 0] = True
    check_grads(dict(mask=mask), dict(mask=mask), q, k, v, d_o)


@pytest.mark.parametrize("window", [0, 3, (2, 0), (0, 4), (None, 1), (5, None)])
def test_local_window(window):
    require("window")
    rng = np.random.default_rng(11)
    q, k, v, d_o = inputs(rng, 1, 21, 21, 2, 2, 8)
    check_grads(dict(local_window_size=window), dict(window=window), q, k, v, d_o)
    check_grads(dict(local_window_size=window, is_causal=True), dict(window=window, is_causal=True), q, k, v, d_o)


@pytest.mark.parametrize("window", [(2**63 - 1, -1), (-1, 2**63 - 2), (3, 2**63 - 30)])
def test_decode_band_at_int64_ends(window):
    """Window sides near int64's end on a shape the decode driver serves
    (Sq 3, Skv 24): its band sums saturate as the tiled ones do. The first
    window, bottom-right with one key, once gave row 0 O = 0 and lse = -inf
    on the decode driver while tiled and dense gave lse -1.48."""
    rng = np.random.default_rng(17)
    q, k, v = uniform(rng, (1, 3, 1, 8)), uniform(rng, (1, 24, 1, 8)), uniform(rng, (1, 24, 1, 8))
    opts = dict(causal_alignment="bottom_right", key_value_seq_lengths=np.array([1], np.int32),
                local_window_size=window)
    unbounded = tuple(None if w < 0 or w >= 2**40 else w for w in window)
    ref = reference(q, k, v, causal_alignment="bottom_right", kv_lengths=[1], window=unbounded)
    tiled_o, tiled_lse = fmha.attention(q, k, v, return_lse=True, strategy="tiled", **opts)
    for strategy in ("auto", "tiled", "dense"):
        o, lse = fmha.attention(q, k, v, return_lse=True, strategy=strategy, **opts)
        assert rel_error(o, ref["o"]) < F32_TOL, strategy
        np.testing.assert_allclose(lse, ref["lse"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(o, tiled_o, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse, tiled_lse, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(tiled_lse))


def test_padding_lengths_and_empty_rows():
    require("q_lengths", "kv_lengths")
    rng = np.random.default_rng(12)
    q, k, v, d_o = inputs(rng, 3, 10, 14, 2, 1, 8)
    ql = np.array([10, 4, 0], np.int32)
    kl = np.array([14, 1, 7], np.int32)
    o = check_grads(dict(query_seq_lengths=ql, key_value_seq_lengths=kl),
                    dict(q_lengths=ql, kv_lengths=kl), q, k, v, d_o)
    assert np.all(o[1, 4:] == 0) and np.all(o[2] == 0)
    _, lse = fmha.attention(q, k, v, key_value_seq_lengths=np.array([0, 14, 14], np.int32), return_lse=True)
    assert np.all(np.isneginf(lse[0])) and np.all(np.isfinite(lse[1:]))


def test_segment_ids():
    require("segments")
    rng = np.random.default_rng(13)
    q, k, v, d_o = inputs(rng, 2, 12, 12, 2, 2, 8)
    seg = np.array([[0] * 5 + [1] * 7, [3] * 12], np.int32)
    check_grads(dict(segment_ids=seg), dict(segment_ids=seg), q, k, v, d_o)
    q2, k2, v2, d_o2 = inputs(rng, 1, 6, 9, 2, 2, 8)
    qs, ks = np.array([[0, 0, 1, 1, 2, 2]]), np.array([[0, 1, 1, 2, 2, 2, 0, 1, 2]])
    check_grads(dict(segment_ids=(qs, ks)), dict(segment_ids=(qs, ks)), q2, k2, v2, d_o2)


def test_masks_compose():
    require("mask", "window", "kv_lengths", "segments")
    rng = np.random.default_rng(14)
    q, k, v, d_o = inputs(rng, 2, 16, 16, 2, 2, 8)
    mask = rng.uniform(size=(2, 1, 16, 16)) > 0.2
    kl = np.array([16, 11], np.int32)
    seg = np.repeat(np.array([[0, 0, 1, 1], [0, 1, 1, 1]]), 4, axis=1)
    opts = dict(mask=mask, local_window_size=(6, 2), key_value_seq_lengths=kl, segment_ids=seg, is_causal=True)
    ref = dict(mask=mask, window=(6, 2), kv_lengths=kl, segment_ids=seg, is_causal=True)
    check_grads(opts, ref, q, k, v, d_o)


def test_mask_callback_matches_causal():
    require("mask_callback")
    rng = np.random.default_rng(15)
    q, k, v, d_o = inputs(rng, 1, 20, 20, 2, 2, 8)

    def fill(tile, visible):
        i = tile.q0 + np.arange(tile.nq)[:, None]
        j = tile.k0 + np.arange(tile.nk)[None, :]
        visible[j > i] = 0

    def classify(tile):
        if tile.k0 > tile.q0 + tile.nq - 1:
            return 0
        return 1 if tile.k0 + tile.nk - 1 <= tile.q0 else 2

    for cb in (fmha.MaskCallback(fill), fmha.MaskCallback(fill, classify)):
        check_grads(dict(mask_callback=cb), dict(is_causal=True), q, k, v, d_o)


def test_callback_exceptions_propagate():
    require("mask_callback")
    rng = np.random.default_rng(16)
    q, k, v, _ = inputs(rng, 1, 8, 8, 1, 1, 8)

    def classify(tile):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        fmha.attention(q, k, v, mask_callback=fmha.MaskCallback(lambda t, m: None, classify))


# ---- biases ------------------------------------------------------------------------------

@pytest.mark.parametrize("bias_shape", [(2, 4, 13, 19), (1, 4, 13, 19), (2, 1, 1, 19), (13, 19), (1, 4, 1, 19)])
def test_dense_bias_and_its_gradient(bias_shape):
    require("bias")
    rng = np.random.default_rng(20 + len(bias_shape))
    q, k, v, d_o = inputs(rng, 2, 13, 19, 4, 2, 8)
    bias = rng.normal(size=bias_shape).astype(np.float32)
    check_grads(dict(bias=bias), dict(bias=bias), q, k, v, d_o, bias_keys=[("bias", "d_bias")])


def test_alibi_rel_table_softcap():
    require("alibi", "rel_table", "softcap")
    rng = np.random.default_rng(21)
    q, k, v, d_o = inputs(rng, 2, 24, 24, 4, 2, 8)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)
    table = rng.normal(size=(4, 16)).astype(np.float32)
    check_grads(dict(alibi_slopes=slopes), dict(alibi=slopes), q, k, v, d_o,
                bias_keys=[("alibi_slopes", "d_alibi")])
    for bidirectional in (True, False):
        check_grads(dict(rel_table=table, rel_max_distance=20, rel_bidirectional=bidirectional),
                    dict(rel_table=table, rel_max_distance=20, rel_bidirectional=bidirectional), q, k, v, d_o,
                    bias_keys=[("rel_table", "d_rel_table")])
    check_grads(dict(softcap=1.5, is_causal=True), dict(softcap=1.5, is_causal=True), q, k, v, d_o)


def test_rel_bucket_matches_the_library():
    if _lib.rel_bucket(0, 32, 128, True) is None:
        pytest.skip("this libfmha does not export fmha_rel_bucket")
    for nb, md, bi in ((32, 128, True), (32, 128, False), (8, 20, True), (3, 5, False), (1, 4, True)):
        rel = np.arange(-300, 301)
        ours = rel_bucket(rel, nb, md, bi)
        theirs = np.array([_lib.rel_bucket(r, nb, md, bi) for r in rel])
        assert np.array_equal(ours, theirs), (nb, md, bi)


def test_bias_callback_matches_dense_bias():
    require("bias_callback", "bias")
    rng = np.random.default_rng(22)
    q, k, v, d_o = inputs(rng, 1, 14, 18, 2, 2, 8)
    bias = rng.normal(size=(1, 2, 14, 18)).astype(np.float32)
    grad = np.zeros_like(bias)

    def fill(tile, scores):
        scores += bias[tile.batch, tile.head_q, tile.q0:tile.q0 + tile.nq, tile.k0:tile.k0 + tile.nk]

    def accumulate(tile, d_scores):
        grad[tile.batch, tile.head_q, tile.q0:tile.q0 + tile.nq, tile.k0:tile.k0 + tile.nk] += d_scores

    check_grads(dict(bias_callback=fmha.BiasCallback(fill, accumulate)), dict(bias=bias), q, k, v, d_o)
    ref = reference(q, k, v, bias=bias, d_out=d_o)
    assert rel_error(grad, ref["d_bias"]) < F32_TOL


# ---- 16-bit dtypes -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_16_bit_dtypes(dtype_name):
    require(dtype_name)
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype_name == "bfloat16" else np.float16
    tol = 2e-2 if dtype_name == "bfloat16" else 4e-3
    rng = np.random.default_rng(23)
    q, k, v, d_o = inputs(rng, 2, 19, 23, 4, 2, 16, dtype=dtype)
    o, lse = fmha.attention(q, k, v, is_causal=True, return_lse=True)
    assert o.dtype == dtype
    ref = reference(q, k, v, is_causal=True, d_out=d_o)
    assert rel_error(o, ref["o"]) < tol
    dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, d_o, is_causal=True)
    assert dq.dtype == dtype
    for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
        assert rel_error(got, ref[name]) < 2 * tol, name


# ---- head dims past 256 ------------------------------------------------------------------------

@pytest.mark.parametrize("D, Dv, is_causal", [(320, 320, True), (512, 512, False), (576, 576, True),
                                              (576, 512, False), (576, 512, True)])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_wide_head_dims(D, Dv, is_causal, dtype_name):
    """Head dims up to FMHA_MAX_HEAD_DIM (576: MLA; Gemma's 512): forward and
    gradients against the float64 reference, tiled and dense; 577 is refused."""
    assert _lib.MAX_HEAD_DIM == 576
    if dtype_name == "bfloat16":
        require("bfloat16")
        import ml_dtypes
        dtype, tol = ml_dtypes.bfloat16, 2e-2
    else:
        dtype, tol = np.float32, F32_TOL
    rng = np.random.default_rng(D + Dv)
    q, k, v, d_o = inputs(rng, 1, 67, 70, 2, 1, D, Dv, dtype=dtype)
    ref = reference(q, k, v, is_causal=is_causal, d_out=d_o)
    for strategy in ("tiled", "dense"):
        o, lse = fmha.attention(q, k, v, is_causal=is_causal, return_lse=True, strategy=strategy)
        assert rel_error(o, ref["o"]) < tol, strategy
        np.testing.assert_allclose(lse, ref["lse"], rtol=1e-5, atol=1e-4)
        dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, d_o, is_causal=is_causal, strategy=strategy)
        for name, got in (("dq", dq), ("dk", dk), ("dv", dv)):
            assert rel_error(got, ref[name]) < 2 * tol, (strategy, name)
    with pytest.raises(FmhaError, match="FMHA_ERR_BAD_HEAD_DIM"):
        fmha.attention(uniform(rng, (1, 2, 1, 577)), uniform(rng, (1, 2, 1, 577)), uniform(rng, (1, 2, 1, 8)))


@pytest.mark.parametrize("N, T", [(16, 1), (128, 1), (16, 2)])
def test_mla_decode_value_inside_key(N, T):
    """DeepSeek's MLA decode: D 576, Dv 512, N query heads on one kv head,
    V the first 512 columns of K (a view: K's memory and strides), ragged
    key lengths; decode driver and tiled strategy against the reference."""
    rng = np.random.default_rng(N + T)
    q = uniform(rng, (2, T, N, 576))
    k = uniform(rng, (2, 200, 1, 576))
    v = k[..., :512]
    lengths = np.array([200, 77], np.int32)
    ref = reference(q, k, v, is_causal=True, causal_alignment="bottom_right", kv_lengths=lengths)
    for strategy in ("auto", "tiled"):
        o, lse = fmha.attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                key_value_seq_lengths=lengths, return_lse=True, strategy=strategy)
        assert o.shape == (2, T, N, 512)
        assert rel_error(o, ref["o"]) < F32_TOL, strategy
        np.testing.assert_allclose(lse, ref["lse"], rtol=1e-5, atol=1e-5)


def test_mla_paged_decode():
    """A paged MLA decode step: a pool of D 576, V its first 512 columns, 16
    heads on one kv head."""
    case = paged_case(31, 1, 16, 1, 16, H=576)
    v = case["k"][..., :512]  # V inside K, as MLA's latent cache
    ref = reference(case["q"], gather(case["k"], case["table"], case["lengths"]),
                    gather(v, case["table"], case["lengths"]), is_causal=True, causal_alignment="bottom_right",
                    kv_lengths=case["lengths"])
    o, lse = fmha.attention(case["q"], case["k"], v, is_causal=True, causal_alignment="bottom_right",
                            key_value_seq_lengths=case["lengths"], block_table=case["table"], return_lse=True)
    check_paged(o, lse, ref)


# ---- against jax.nn.dot_product_attention -------------------------------------------------------

def test_matches_jax_nn():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(24)
    q, k, v, _ = inputs(rng, 2, 11, 13, 4, 2, 8)
    for opts in (dict(), dict(is_causal=True), dict(scale=0.7)):
        want = np.asarray(jax.nn.dot_product_attention(q, k, v, **opts))
        np.testing.assert_allclose(fmha.attention(q, k, v, **opts), want, atol=2e-6)


# ---- errors ------------------------------------------------------------------------------

@pytest.fixture
def no_c_calls(monkeypatch):
    """Fails the test if the library is called (errors must come first)."""
    class Refuse:
        def __getattr__(self, name):
            raise AssertionError(f"C function {name} called before the argument check")

    monkeypatch.setattr(_lib, "load", lambda: Refuse())


def test_bad_arguments_raise_before_any_c_call(no_c_calls):
    rng = np.random.default_rng(25)
    q, k, v, _ = inputs(rng, 2, 4, 5, 4, 2, 8)
    cases = [
        (ValueError, dict(query=q[0, 0])),                                   # 2-D
        (ValueError, dict(key=k[:1])),                                       # batch mismatch
        (ValueError, dict(key=k[..., :4], value=v[..., :4])),                # head dim mismatch
        (ValueError, dict(key=uniform(rng, (2, 5, 3, 8)), value=uniform(rng, (2, 5, 3, 8)))),  # 4 % 3
        (ValueError, dict(value=v[:, :4])),                                  # value length
        (TypeError, dict(query=q.astype(np.float64), key=k.astype(np.float64), value=v.astype(np.float64))),
        (TypeError, dict(key=k.astype(np.float16))),                         # mixed dtypes
        (TypeError, dict(query=q.astype(np.int32), key=k.astype(np.int32), value=v.astype(np.int32))),
        (ValueError, dict(bias=np.zeros((2, 4, 3, 5), np.float32))),          # T = 3 is not 1 or 4
        (ValueError, dict(mask=np.ones((3, 4, 5), bool))),                    # N = 3
        (TypeError, dict(mask=np.ones((4, 5), np.float32))),                  # additive masks go to bias
        (ValueError, dict(key_value_seq_lengths=np.array([5, 6]))),           # out of range
        (ValueError, dict(query_seq_lengths=np.array([1, 2, 3]))),            # wrong length
        (TypeError, dict(key_value_seq_lengths=np.array([1.0, 2.0]))),
        (ValueError, dict(local_window_size=-2)),
        (TypeError, dict(local_window_size=(1, 2, 3))),
        (ValueError, dict(scale=float("nan"))),
        (ValueError, dict(strategy="fastest")),
        (ValueError, dict(causal_alignment="middle", is_causal=True)),
        (ValueError, dict(alibi_slopes=np.ones(3, np.float32))),
        (ValueError, dict(rel_table=np.ones((4,), np.float32))),
        (ValueError, dict(softcap=-1.0)),
        (ValueError, dict(segment_ids=np.zeros((2, 4), np.int32))),           # T != S needs a pair
        (TypeError, dict(query="not an array")),
    ]
    for exc, override in cases:
        args = dict(query=q, key=k, value=v)
        args.update(override)
        with pytest.raises(exc):
            fmha.attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)
    o = np.zeros((2, 4, 4, 8), np.float32)
    lse = np.zeros((2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="lse"):
        fmha.attention_backward(q, k, v, o, lse[:, :, :2], o)
    with pytest.raises(ValueError, match="d_out"):
        fmha.attention_backward(q, k, v, o, lse, o[:, :2])
    with pytest.raises(TypeError):
        fmha.attention_backward(q, k, v, o.astype(np.float16), lse, o)


def test_c_errors_carry_the_c_message():
    rng = np.random.default_rng(26)
    q = uniform(rng, (1, 4, 2, _lib.MAX_HEAD_DIM + 1))
    with pytest.raises(FmhaError) as info:
        fmha.attention(q, q, q)
    err = info.value
    assert err.status == _lib.ERR_BAD_HEAD_DIM and err.name == "FMHA_ERR_BAD_HEAD_DIM"
    c_text = _lib.load().fmha_status_string(_lib.ERR_BAD_HEAD_DIM).decode()
    assert err.c_message == c_text and c_text in str(err)
    with pytest.raises(FmhaError, match="FMHA_ERR_BAD_THREAD_COUNT"):
        fmha.set_num_threads(-3)


def test_unsupported_requests_are_fmha_errors():
    """Whatever the build serves, the answer is a result or FMHA_ERR_UNSUPPORTED, never a crash."""
    for feature in ("mask", "bias", "window", "q_lengths", "kv_lengths", "segments", "alibi", "rel_table",
                    "softcap", "bfloat16", "float16"):
        from conftest import unsupported_reason

        reason = unsupported_reason(feature)
        assert reason is None or "FMHA_ERR_UNSUPPORTED" in reason


def test_precision_fast_is_bf16_accurate_and_bad_precision_raises():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    q, k, v = (rng.uniform(-1, 1, (1, 90, 2, 32)).astype(ml_dtypes.bfloat16) for _ in range(3))
    exact = fmha.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    for precision in ("accurate", "fast"):
        out = fmha.attention(q, k, v, precision=precision).astype(np.float32)
        # both stay within a few bf16 roundings of the float32 result
        assert rel_error(out, exact) < 1e-2, precision
    with pytest.raises(ValueError, match="precision"):
        fmha.attention(q, k, v, precision="medium")


# float32 at the matrix engine's precisions (fmha_precision BF16X3, BF16):
# split into bf16 hi + lo (three tile products) or rounded to bf16 where the
# CPU has AMX tiles; off the matrix driver, BF16 rounded onto the bf16 pair
# products where the kernel table has them (these ISAs), float32 FMA
# elsewhere; within each precision's bound of the float64 reference
# (relative L2: 2e-5 for bf16x3, 1e-2 for bf16).
PAIR_ISAS = ("avx512bf16", "amx", "amx_emu", "neonbf16")
@pytest.mark.parametrize("precision, bound", [("bf16x3", 2e-5), ("bf16", 1e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_float32_matrix_precisions(precision, bound, causal):
    rng = np.random.default_rng(11 + causal)
    q, k, v = (uniform(rng, (2, 300, 4, 64)) for _ in range(3))
    ref = reference(q, k, v, is_causal=causal)
    out, lse = fmha.attention(q, k, v, is_causal=causal, precision=precision, return_lse=True)
    assert rel_error(out, ref["o"]) < bound
    assert rel_error(lse, ref["lse"]) < bound
    line = fmha.describe(q, k, v, is_causal=causal, precision=precision)
    isa = line.split(" isa=")[1].split()[0]
    if "driver=matrix" in line:
        assert f" precision={precision} " in line
    elif precision == "bf16" and isa in PAIR_ISAS:
        assert " path=bf16 precision=bf16 " in line
    else:
        assert " precision=float32 " in line
    # the default keeps float32's FMA path
    assert " precision=float32 " in fmha.describe(q, k, v, is_causal=causal)


def test_unknown_precision_is_refused():
    q = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(ValueError, match="unknown precision 'bf32'"):
        fmha.attention(q, q, q, precision="bf32")
