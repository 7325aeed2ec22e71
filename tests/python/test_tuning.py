"""fmha.tuning_status and fmha.tune (fmha_tuning_status, fmha_tune through
ctypes): where the tuning came from, describe's tuning_source, and a wisdom
path holding something else refused with nothing written. The planner's
measuring itself is the C test's (test_wisdom, on shrunk problems)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import fmha
from fmha._lib import FmhaError


def test_tuning_status_names_the_source():
    status = fmha.tuning_status()
    assert status.startswith(fmha.isa_name() + ": tuning ")
    assert "(source " in status and "FMHA_WISDOM" in status and "caches L1d" in status
    q = np.zeros((1, 128, 2, 64), np.float32)
    line = fmha.describe(q, q, q)
    source = line.split(" tuning_source=")[1].split()[0]
    assert source in ("env", "wisdom", "builtin", "heuristic", "generic")
    assert f"(source {source})" in status


def test_tune_refuses_a_file_that_is_not_wisdom(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not wisdom\n")
    with pytest.raises(FmhaError, match="FMHA_ERR_BAD_FILE") as info:
        fmha.tune(str(path), budget_s=1.0)
    assert "nothing written" in str(info.value)
    assert path.read_text() == "not wisdom\n"


def test_refused_wisdom_in_the_status_not_on_stderr(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"fmha_wisdom": 1, "entries": [{"vendor": "V", "family": 1, "model": 2, "isa": "x", '
                   '"fields": {"block_kv": 48}}]}')
    code = "import fmha; print(fmha.tuning_status())"
    env = dict(os.environ, FMHA_WISDOM=str(bad))
    env.pop("FMHA_TUNING", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "refused, nothing of it used: entries[0]: block_kv must be" in proc.stdout
    assert proc.stderr == ""
