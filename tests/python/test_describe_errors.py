"""fmha.describe (fmha_plan_describe through the NumPy binding) and the
library's detail message in FmhaError: a refused call names the argument,
what it must be and what it got."""

import numpy as np
import pytest

import fmha
from fmha import _lib
from fmha._lib import FmhaError


def fields(line):
    """key=value fields of a describe line (cpu's quoted value kept whole)."""
    head, _, rest = line.partition(' cpu="')
    cpu, _, tail = rest.partition('"')
    out = dict(f.split("=", 1) for f in head.split() + tail.split())
    out["cpu"] = cpu
    return out


def test_describe_tiled_and_decode():
    q = np.zeros((1, 128, 8, 64), np.float32)
    k = np.zeros((1, 128, 2, 64), np.float32)
    f = fields(fmha.describe(q, k, k))
    assert f["driver"] == "tiled" and f["isa"] == fmha.isa_name() and f["path"] == "f32"
    assert f["k_format"] == f["v_format"] == "f32" and int(f["threads"]) >= 1 and f["cpu"]
    assert f["tuning"] and '"' not in f["cpu"]
    f = fields(fmha.describe(q[:, :1], k, k, key_value_seq_lengths=[100]))
    assert f["driver"] == "decode" and int(f["splits"]) >= 1
    # a call it would refuse is refused the same way
    with pytest.raises(ValueError, match="key_value_seq_lengths"):
        fmha.describe(q[:, :1], k, k, key_value_seq_lengths=[300])
    with pytest.raises(TypeError, match="unexpected keyword"):
        fmha.describe(q, k, k, not_an_option=1)


def test_describe_small_is_dense():
    q = np.zeros((1, 8, 2, 16), np.float32)
    assert fields(fmha.describe(q, q, q))["driver"] == "dense"
    assert "describe" in dir(fmha) and "attention" in dir(fmha)


def test_error_detail_names_the_argument():
    p = _lib.problem_init(1, 2, 2, 4, 4, 1000, 1000)
    with pytest.raises(FmhaError) as e:
        _lib.check(_lib.load().fmha_problem_check(p), "fmha_problem_check")
    assert e.value.detail == f"head_dim must lie in 1..{_lib.MAX_HEAD_DIM}, got 1000"
    assert e.value.detail in str(e.value) and e.value.name == "FMHA_ERR_BAD_HEAD_DIM"
    p = _lib.problem_init(1, 4, 3, 4, 4, 8, 8)
    with pytest.raises(FmhaError, match=r"heads_q must be a multiple of heads_kv, got 4 and 3"):
        _lib.check(_lib.load().fmha_problem_check(p))
    # a successful call leaves no message behind
    p = _lib.problem_init(1, 2, 2, 4, 4, 8, 8)
    assert _lib.load().fmha_problem_check(p) == 0 and _lib.last_error_message() == ""
