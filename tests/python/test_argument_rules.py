"""The argument rules every binding applies alike: index arrays checked
before any cast to int32 (never a wrap), values that name their argument
when refused, and what is valid accepted (a flipped length-1 axis, empty
dims). NumPy always; the torch cases skip without PyTorch."""

import numpy as np
import pytest

import fmha
from conftest import reference


def rnd(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_block_table_beyond_int32_is_refused_not_wrapped():
    q = rnd((1, 1, 2, 8))
    pool = rnd((3, 4, 2, 8), 1)
    with pytest.raises(ValueError, match=r"block_table must lie in int32's range"):
        fmha.attention(q, pool, pool, block_table=np.array([[2 + 2**32]], np.int64), key_value_seq_lengths=[3])


def test_segment_ids_beyond_int32_are_refused_not_wrapped():
    q = rnd((1, 4, 2, 8))
    ids = np.array([[2**32, 0, 0, 0]], np.int64)
    with pytest.raises(ValueError, match=r"q_segment_ids must lie in int32's range"):
        fmha.attention(q, q, q, segment_ids=ids)
    # int64 ids inside int32's range are accepted and mean what they say
    ids = np.array([[7, 7, -3, -3]], np.int64)
    out = fmha.attention(q, q, q, segment_ids=ids)
    want = reference(q, q, q, segment_ids=(ids, ids))["o"]
    assert np.max(np.abs(out - want)) < 2e-5


def test_flipped_unit_batch_axis_is_read():
    q, k, v = rnd((1, 4, 2, 8)), rnd((1, 6, 2, 8), 1), rnd((1, 6, 2, 8), 2)
    kf = np.flip(k, 0)
    assert kf.strides[0] < 0
    assert np.array_equal(fmha.attention(q, kf, v), fmha.attention(q, k, v))


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(local_window_size=(2**63, 0)), ValueError, "local_window_size sides must lie in 0..2\\*\\*63 - 1"),
    (dict(alibi_slopes=np.array([0.5, np.nan], np.float32)), ValueError, "alibi_slopes must be finite"),
    (dict(rel_table=np.zeros((2, 8), np.float32), rel_max_distance=0), ValueError, "rel_max_distance must lie"),
    (dict(rel_table=np.zeros((2, 8), np.float32), rel_max_distance=2**40), ValueError, "rel_max_distance must lie"),
    (dict(rel_table=np.zeros((2, 8), np.float32), rel_max_distance=3.5), TypeError, "rel_max_distance must be an int"),
    (dict(rel_table=np.zeros((2, 8), np.float32), rel_bidirectional=2), ValueError, "rel_bidirectional must be a"),
    (dict(scale=1e300), ValueError, "scale must be a finite float32"),
    (dict(dropout_p=0.1, dropout_seed=2**64), ValueError, "dropout_seed must be an integer in \\[0, 2\\*\\*64\\)"),
])
def test_refusals_name_the_argument(kwargs, error, text):
    q = rnd((1, 4, 2, 8))
    with pytest.raises(error, match=text):
        fmha.attention(q, q, q, **kwargs)


def test_unbatched_lengths_take_one_value():
    q = rnd((4, 2, 8))
    with pytest.raises(ValueError, match="query_seq_lengths of unbatched"):
        fmha.attention(q, q, q, query_seq_lengths=[2, 3])
    assert np.array_equal(fmha.attention(q, q, q, query_seq_lengths=[2]), fmha.attention(q, q, q, query_seq_lengths=2))


@pytest.mark.parametrize("B, T, S", [(1, 0, 6), (1, 4, 0), (0, 4, 6)])
def test_empty_dims_give_empty_or_zero_results(B, T, S):
    q, k = np.ones((B, T, 2, 8), np.float32), np.ones((B, S, 2, 8), np.float32)
    out, lse = fmha.attention(q, k, k, return_lse=True)
    assert out.shape == (B, T, 2, 8) and lse.shape == (B, 2, T)
    assert not out.any() and np.all(lse == -np.inf)
    dq, dk, dv = fmha.attention_backward(q, k, k, out, lse, np.ones_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and not (dq.any() or dk.any() or dv.any())
    sinks = np.array([1.5, -2.0], np.float32)
    _, lse = fmha.attention(q, k, k, sinks=sinks, return_lse=True)
    assert np.all(lse == sinks.reshape(1, 2, 1))


def test_dropout_seed_upper_half_same_in_numpy_and_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import fmha.torch as ft

    q = rnd((1, 16, 2, 8))
    seed = 2**63 + 12345
    a = fmha.attention(q, q, q, dropout_p=0.3, dropout_seed=seed)
    t = torch.from_numpy(q).transpose(1, 2)
    b = ft.scaled_dot_product_attention(t, t, t, dropout_p=0.3, dropout_seed=seed).transpose(1, 2).numpy()
    assert np.max(np.abs(a - b)) < 1e-6


def test_torch_index_arrays_beyond_int32():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import fmha.torch as ft

    q = torch.from_numpy(rnd((1, 2, 4, 8)))
    ids = torch.tensor([[2**32, 0, 0, 0]], dtype=torch.int64)
    with pytest.raises(ValueError, match="segment_ids must lie in int32's range"):
        ft.scaled_dot_product_attention(q, q, q, segment_ids=ids)


def test_mask_shape_named_as_given():
    q = rnd((1, 16, 2, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(16, 15\) does not broadcast .*its dimension 1"):
        fmha.attention(q, q, q, mask=np.ones((16, 15), bool))


def test_python_lists_get_a_dtype_hint():
    with pytest.raises(TypeError, match="query has dtype float64 \\(a Python list becomes a float64 array"):
        fmha.attention([[[[0.0] * 8]]], [[[[0.0] * 8]]], [[[[0.0] * 8]]])


def test_torch_mask_shape_named_as_given():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import fmha.torch as ft

    q = torch.zeros(1, 2, 16, 8)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(16, 15\) does not broadcast"):
        ft.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(16, 15))


def test_library_argument_errors_are_value_errors():
    """A status that means a bad argument is an FmhaArgumentError: caught by
    `except ValueError` like the bindings' own checks, and still by `except
    FmhaError` and `except RuntimeError`, with its status and detail. A
    limit of the library (UNSUPPORTED) or the machine (OUT_OF_MEMORY) is not
    a ValueError."""
    from fmha import _lib

    q = rnd((1, 2, 1, 577))
    for kind in (ValueError, fmha.FmhaError, fmha.FmhaArgumentError, RuntimeError):
        with pytest.raises(kind) as e:
            fmha.attention(q, q, rnd((1, 2, 1, 8)))
        assert e.value.status == _lib.ERR_BAD_HEAD_DIM and e.value.name == "FMHA_ERR_BAD_HEAD_DIM"
        assert "head_dim must lie in 1..576, got 577" in e.value.detail
    for status in sorted(_lib.ARGUMENT_STATUSES):
        error = fmha.FmhaError(status)
        assert isinstance(error, ValueError) and isinstance(error, RuntimeError), error.name
    for status in (_lib.ERR_UNSUPPORTED, _lib.ERR_OUT_OF_MEMORY):
        error = fmha.FmhaError(status)
        assert isinstance(error, fmha.FmhaError) and not isinstance(error, ValueError), error.name
    assert {"BAD_SIZE", "BAD_HEADS", "BAD_STRIDE", "OVERLAP", "BAD_OPTION", "BAD_MASK", "BAD_PAGE",
            "NULL_POINTER"} <= {_lib.STATUS_NAMES[s][len("FMHA_ERR_"):] for s in _lib.ARGUMENT_STATUSES}


def test_jax_argument_errors_are_value_errors():
    pytest.importorskip("jax", reason="JAX is not installed")
    import fmha.jax as fj
    q = rnd((1, 2, 1, 577))
    with pytest.raises(ValueError, match="FMHA_ERR_BAD_HEAD_DIM") as e:
        fj.dot_product_attention(q, q, rnd((1, 2, 1, 8)))
    assert isinstance(e.value, fmha.FmhaError)


def test_package_names_are_listed():
    """dir(fmha) and fmha.__all__ list the public names, each of which resolves."""
    assert {"attention", "attention_backward", "merge", "describe", "FmhaError", "FmhaArgumentError"} <= set(dir(fmha))
    assert set(fmha.__all__) <= set(dir(fmha))
    for name in fmha.__all__:
        assert getattr(fmha, name) is not None, name
    namespace = {}
    exec("from fmha import *", namespace)
    assert namespace["attention"] is fmha.attention
