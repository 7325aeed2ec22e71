"""Tests of fmha-bench: the record's schema (the seed's keys), --append,
atomic writes, command-line errors, --peaks, --max-fit, and that rel_err
catches a wrong result. The binary comes from $FMHA_BENCH (default
build/fmha-bench under the repo root). Sizes are tiny and rows are shortened
with the test-only flags --min-samples / --min-sample-ms."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(os.environ.get("FMHA_BENCH", ROOT / "build" / "fmha-bench"))
SEED = ROOT.parent / "shared" / "seed" / "attention-benchmark-record.json"

pytestmark = pytest.mark.skipif(
    not (BENCH.is_file() and os.access(BENCH, os.X_OK)),
    reason=f"fmha-bench binary not found at {BENCH} (build it, or set FMHA_BENCH)",
)

FAST = ["--heads", "2", "--dims", "32", "--min-samples", "3", "--min-sample-ms", "1"]
TOP_KEYS = {"device", "config", "results", "configs", "note"}
ROW_KEYS = ["impl", "mode", "variant", "dtype", "batch", "seq", "heads", "head_dim",
            "compile_s", "inner", "median_ms", "q1_ms", "q3_ms", "rel_err"]
CONFIG_KEYS = ["device", "append", "seqs", "dims", "dtypes", "variants", "modes", "batch", "heads",
               "impls", "no_ref", "peaks", "peak_seqs", "peak_impls", "peak_timeout", "max_fit",
               "fit_seqs", "fit_impls"]


def run(args, tmp_path, env_extra=None, timeout=300):
    env = dict(os.environ)
    env.pop("FMHA_BENCH_TESTING", None)
    env.update(env_extra or {})
    return subprocess.run([str(BENCH), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def bench(tmp_path, *args, out="r.json", env_extra=None):
    proc = run([*FAST, *args, "--out", out], tmp_path, env_extra)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / out) as f:
        return json.load(f), proc


def ran(row):
    """True for a row that ran. Until the library serves the backward, fwdbwd
    rows may be "unsupported" (and then carry no numbers)."""
    if row["mode"] == "fwdbwd" and row["status"] == "unsupported":
        assert "median_ms" not in row and "rel_err" not in row
        return False
    assert row["status"] == "ok", row
    return True


def temp_files(tmp_path):
    return [p.name for p in tmp_path.iterdir() if ".tmp." in p.name]


def test_help_exits_zero(tmp_path):
    proc = run(["--help"], tmp_path)
    assert proc.returncode == 0
    assert "usage: fmha-bench" in proc.stdout
    assert "--peak-timeout" in proc.stdout and "--max-fit" in proc.stdout
    assert not list(tmp_path.iterdir())


def test_schema_has_the_seeds_keys(tmp_path):
    doc, proc = bench(tmp_path, "--seqs", "64,128", "--modes", "fwd,fwdbwd",
                      "--impls", "fmha_auto,fmha_dense,fmha_tiled,fmha_portable", "--portable-max-seq", "64")
    assert set(doc) == TOP_KEYS
    row_keys, config_keys = ROW_KEYS, CONFIG_KEYS
    if SEED.is_file():
        seed = json.loads(SEED.read_text())
        assert set(seed) == TOP_KEYS
        # Every seed row key that applies to fmha (not XLA's lowering fields).
        row_keys = [k for k in seed["results"][0] if not k.startswith(("xla_", "lower_"))]
        config_keys = [k for k in seed["config"] if k != "interpret_max_seq"]
        assert set(ROW_KEYS) <= set(row_keys)
    for key in ("cpu", "isa", "threads", "compiler", "fmha_version", "git_commit"):
        assert key in doc["device"], key
    assert doc["device"]["isa"] and isinstance(doc["device"]["isa"], str)
    for key in config_keys:
        assert key in doc["config"], key
    assert doc["config"]["seqs"] == "64,128" and doc["config"]["heads"] == 2
    assert doc["config"]["portable_max_seq"] == 64
    assert doc["configs"] == [doc["config"]]
    assert isinstance(doc["note"], str) and doc["note"]

    rows = doc["results"]
    # portable only up to --portable-max-seq: 2 modes x (4 impls at 64 + 3 at 128).
    assert len(rows) == 14
    assert not [r for r in rows if r["impl"] == "fmha_portable" and r["seq"] > 64]
    for r in rows:
        if not ran(r):
            continue
        for key in row_keys:
            assert key in r, (key, r)
        for key in ("temp_mb", "arg_mb", "out_mb", "gflops"):
            assert key in r
        assert r["q1_ms"] <= r["median_ms"] <= r["q3_ms"]
        assert r["inner"] >= 1 and r["compile_s"] > 0 and r["gflops"] > 0
        assert r["rel_err"] < 1e-5, r
        assert r["arg_mb"] > 0 and r["out_mb"] > 0 and r["temp_mb"] >= 0
    # The progress lines and the terminal table.
    assert "[row 1/14]" in proc.stderr and "[row 14/14]" in proc.stderr
    assert "median_ms" in proc.stdout and "GFLOP/s" in proc.stdout
    assert proc.stdout.count("fmha_tiled") == 4
    assert not temp_files(tmp_path)


def test_append_keeps_rows_and_configs(tmp_path):
    first, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--note", "first run")
    second, _ = bench(tmp_path, "--seqs", "128", "--modes", "fwd", "--impls", "fmha_dense", "--append")
    assert second["results"][:1] == first["results"]
    assert [(r["impl"], r["seq"]) for r in second["results"]] == [("fmha_tiled", 64), ("fmha_dense", 128)]
    assert len(second["configs"]) == 2
    assert second["configs"][0] == first["config"]
    assert second["configs"][1] == second["config"]
    assert second["config"]["append"] is True and second["config"]["seqs"] == "128"
    assert second["note"] == "first run"
    third, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_auto", "--append",
                     "--note", "third")
    assert len(third["results"]) == 3 and len(third["configs"]) == 3 and third["note"] == "third"
    assert not temp_files(tmp_path)


def test_append_to_a_missing_file_creates_it(tmp_path):
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--append",
                   out="new.json")
    assert len(doc["results"]) == 1 and len(doc["configs"]) == 1


@pytest.mark.skipif(not SEED.is_file(), reason="the seed record is not in shared/")
def test_append_to_the_seed_record_keeps_its_rows(tmp_path):
    seed = json.loads(SEED.read_text())
    (tmp_path / "seed.json").write_text(SEED.read_text())
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--append",
                   out="seed.json")
    assert doc["results"][:-1] == seed["results"]
    assert len(doc["configs"]) == len(seed["configs"]) + 2  # the seed's own config, then ours
    assert doc["configs"][0]["machine"] == seed["device"]
    assert doc["note"] == seed["note"]


def test_failed_append_leaves_the_old_file_intact(tmp_path):
    broken = '{"results": [1, 2'
    (tmp_path / "r.json").write_text(broken)
    proc = run([*FAST, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--append",
                "--out", "r.json"], tmp_path)
    assert proc.returncode == 1
    assert "not valid JSON" in proc.stderr
    assert (tmp_path / "r.json").read_text() == broken
    assert not temp_files(tmp_path)


def test_killed_run_leaves_the_old_file_intact(tmp_path):
    first, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled")
    before = (tmp_path / "r.json").read_bytes()
    env = dict(os.environ)
    proc = subprocess.Popen([str(BENCH), "--heads", "2", "--seqs", "64,128,256,512,1024", "--append",
                             "--out", "r.json"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Wait for the first row to start, then kill the run mid-way.
    deadline = time.time() + 60
    line = proc.stderr.readline()
    while "[row" not in line and time.time() < deadline and line:
        line = proc.stderr.readline()
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "r.json").read_bytes() == before
    assert json.loads(before) == first


def test_unwritable_output_fails_before_running(tmp_path):
    proc = run([*FAST, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--out", "missing/r.json"],
               tmp_path)
    assert proc.returncode == 1 and "cannot write" in proc.stderr
    assert "[row" not in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args", [
    ["--bogus"],
    ["--seqs", "12,x"],
    ["--seqs", ""],
    ["--seqs", "64,64"],
    ["--seqs", "0"],
    ["--seqs"],
    ["--dims", "1000"],
    ["--impls", "nope"],
    ["--impls", "fmha_wrong_for_test"],
    ["--dtypes", "float64"],
    ["--precision", "medium"],
    ["--variants", "sparse"],
    ["--modes", "bwd"],
    ["--heads", "0"],
    ["--dim-v", "0"],
    ["--dim-v", "32", "--kv-format", "int8"],
    ["--kv-format", "int8", "--kv-dtype", "bfloat16"],
    ["--dim-v", "32", "--page-size", "16"],
    ["--kv-lengths", "uniform:0.5"],
    ["--kv-lengths", "uniform:0.5", "--variants", "decode,causal"],
    ["--kv-lengths", "uniform:0", "--variants", "decode"],
    ["--kv-lengths", "uniform:1.5", "--variants", "decode"],
    ["--kv-lengths", "zipf:1", "--variants", "decode"],
    ["--threads", "-1"],
    ["--peak-timeout", "-1"],
    ["--mem-budget-mb", "x"],
    ["--no-ref=1"],
    ["positional"],
])
def test_bad_command_lines_exit_2_and_write_nothing(tmp_path, args):
    proc = run([*args, "--out", "r.json"] if args != ["--seqs"] else ["--out", "r.json", *args], tmp_path)
    assert proc.returncode == 2, (args, proc.stderr)
    assert proc.stderr.startswith("fmha-bench: ")
    assert not list(tmp_path.iterdir())


def test_rel_err_is_not_blind(tmp_path):
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd,fwdbwd", "--impls", "fmha_tiled,fmha_wrong_for_test",
                   env_extra={"FMHA_BENCH_TESTING": "1"})
    rows = {(r["impl"], r["mode"]): r for r in doc["results"]}
    for mode in ("fwd", "fwdbwd"):
        if ran(rows[("fmha_tiled", mode)]) and ran(rows[("fmha_wrong_for_test", mode)]):
            assert rows[("fmha_tiled", mode)]["rel_err"] < 1e-5
            assert rows[("fmha_wrong_for_test", mode)]["rel_err"] > 1e-2
    assert rows[("fmha_wrong_for_test", "fwd")]["rel_err"] > 1e-2


def test_variants_dtypes_and_unsupported_rows(tmp_path):
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd,fwdbwd", "--impls", "fmha_tiled",
                   "--variants", "plain,causal,masked_bias", "--dtypes", "float32,bfloat16,float16")
    rows = doc["results"]
    assert len(rows) == 2 * 3 * 3
    seen = {(r["variant"], r["dtype"]) for r in rows}
    assert len(seen) == 9
    for r in rows:
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and "rel_err" in r
            if r["rel_err"] is None:
                # Only where the build's reference cannot serve the variant, and said so.
                assert r["variant"] == "masked_bias" and "no masks or biases" in r["rel_err_note"]
            elif r["dtype"] == "float32":
                assert r["rel_err"] < 1e-5, r
            else:
                assert r["rel_err"] < 2e-2, r
        else:
            # Never a fake number: a row that did not run has no timing.
            assert r["status"] == "unsupported", r
            assert "median_ms" not in r and "rel_err" not in r and r["error"]
    for r in rows:
        if r["variant"] in ("plain", "causal") and r["dtype"] == "float32" and ran(r):
            assert r["rel_err"] < 1e-5
    causal = next(r for r in rows if r["variant"] == "causal" and r["mode"] == "fwd" and r["dtype"] == "float32")
    plain = next(r for r in rows if r["variant"] == "plain" and r["mode"] == "fwd" and r["dtype"] == "float32")
    # Causal counts half the flops.
    assert causal["gflops"] * causal["median_ms"] == pytest.approx(plain["gflops"] * plain["median_ms"] / 2)


def test_paged_cache_rows(tmp_path):
    """--page-size: K and V in a shuffled paged cache; the forward matches the
    float64 reference (the same values as the contiguous rows) and the
    backward, which paged caches do not have, is an unsupported row."""
    doc, _ = bench(tmp_path, "--seqs", "100", "--seq-q", "2", "--heads-kv", "1", "--page-size", "3",
                   "--modes", "fwd,fwdbwd", "--impls", "fmha_auto,fmha_plan", "--variants", "plain,causal",
                   "--dtypes", "float32,float16")
    rows = doc["results"]
    assert len(rows) == 2 * 2 * 2 * 2 and doc["config"]["page_size"] == 3
    for r in rows:
        assert r["page_size"] == 3 and r["seq_q"] == 2 and r["heads_kv"] == 1
        if r["mode"] == "fwdbwd":
            assert r["status"] == "unsupported" and "median_ms" not in r
            continue
        assert r["status"] == "ok", r
        assert r["rel_err"] < (1e-5 if r["dtype"] == "float32" else 2e-3), r
        assert r["kv_gbs"] > 0


def test_decode_rows(tmp_path):
    """The decode variant: one causal step of --seq-q queries (default 1)
    against a cache of seq keys with key_value_seq_lengths = seq; rows carry
    seq_q, match the float64 reference, count the bottom-right scores in
    GFLOP/s and report K+V GB/s; through a paged cache too."""
    doc, _ = bench(tmp_path, "--seqs", "200", "--heads-kv", "1", "--modes", "fwd,fwdbwd",
                   "--impls", "fmha_auto,fmha_tiled", "--variants", "decode")
    rows = doc["results"]
    assert len(rows) == 4
    for r in rows:
        assert r["variant"] == "decode" and r["seq_q"] == 1, r
        assert r["status"] == "ok" and r["rel_err"] < 1e-5, r
        # one query sees all 200 keys: 4 * heads * 200 * D flops (x3.5 fwdbwd)
        flops = 4 * 2 * 200 * 32 * (3.5 if r["mode"] == "fwdbwd" else 1)
        assert r["gflops"] == pytest.approx(flops / (r["median_ms"] * 1e6), rel=0.02), r
        assert r["kv_gbs"] > 0
    doc, _ = bench(tmp_path, "--seqs", "100", "--seq-q", "3", "--heads-kv", "1", "--page-size", "7",
                   "--modes", "fwd", "--impls", "fmha_auto", "--variants", "decode")
    (r,) = [r for r in doc["results"] if r["seq"] == 100 and r.get("page_size") == 7]
    assert r["seq_q"] == 3 and r["status"] == "ok" and r["rel_err"] < 1e-5, r


def test_paged_format_rows(tmp_path):
    """--kv-format with --page-size: the format's rows (and int8's scales a
    key) in a shuffled paged cache, over sequences of uneven lengths; each
    row holds the same values as the contiguous cache, so its error against
    the float64 reference is the contiguous row's, and its KV_GB/s counts
    the rows as stored."""
    for fmt in ("int8", "fp8_e4m3", "q8_0", "q4_0"):
        errs = {}
        for page in ([], ["--page-size", "5"]):
            doc, _ = bench(tmp_path, "--seqs", "96", "--batch", "3", "--heads-kv", "2", "--heads", "8", "--dims", "64",
                           "--kv-lengths", "uniform:0.5", "--kv-format", fmt, "--modes", "fwd",
                           "--impls", "fmha_auto", "--variants", "decode", *page)
            (r,) = doc["results"]
            assert r["status"] == "ok" and r["kv_format"] == fmt and r["kv_gbs"] > 0, r
            assert r.get("page_size", 0) == (5 if page else 0), r
            errs[bool(page)] = r["rel_err"]
        assert errs[True] == pytest.approx(errs[False], rel=1e-3, abs=1e-6), (fmt, errs)
        assert errs[True] < 0.1, (fmt, errs)  # the format's rounding, not a misplaced row


def test_uneven_decode_rows(tmp_path):
    """--kv-lengths uniform:F: a decode step over sequences of different
    lengths (sequence 0 full, the others drawn from [F seq, seq], the same
    every run), contiguous and paged; rows match the float64 reference of
    those lengths and count the keys cached in GFLOP/s and KV_GB/s."""
    rows = []
    for page in ([], ["--page-size", "16"]):
        doc, _ = bench(tmp_path, "--seqs", "300", "--batch", "5", "--heads-kv", "1", "--kv-lengths", "uniform:0.25",
                       "--modes", "fwd", "--impls", "fmha_auto,fmha_tiled", "--variants", "decode", *page)
        assert doc["config"]["kv_min_fraction"] == 0.25
        rows += doc["results"]
    means = {r["kv_len_mean"] for r in rows}
    assert len(means) == 1, means  # the same lengths in every row and run
    (mean,) = means
    assert 75 <= mean < 300  # sequence 0 holds 300 keys, the others fewer or as many
    for r in rows:
        assert r["status"] == "ok" and r["rel_err"] < 1e-5 and r["kv_min_fraction"] == 0.25, r
        # 5 sequences, 2 heads, one query each over its own keys, D = Dv = 32
        assert r["gflops"] == pytest.approx(2 * 5 * 2 * mean * 64 / (r["median_ms"] * 1e6), rel=0.02), r
        assert r["kv_gbs"] == pytest.approx(5 * mean * 2 * 32 * 4 / (r["median_ms"] * 1e6), rel=0.02), r
    full, _ = bench(tmp_path, "--seqs", "300", "--batch", "5", "--heads-kv", "1", "--modes", "fwd",
                    "--impls", "fmha_auto", "--variants", "decode", out="full.json")
    assert "kv_len_mean" not in full["results"][0]


def test_value_head_dim_rows(tmp_path):
    """--dim-v: V and O of their own head dim (MLA's 576 / 512 shape); rows
    carry head_dim_v, match the float64 reference of that shape, count
    2 * B * H * pairs * (D + Dv) flops and K + V bytes of each dim; peak
    children get the option too."""
    doc, proc = bench(tmp_path, "--seqs", "200", "--dims", "64", "--dim-v", "40", "--heads-kv", "1",
                      "--modes", "fwd,fwdbwd", "--impls", "fmha_auto,fmha_tiled", "--variants", "decode,plain",
                      "--dtypes", "float32,bfloat16", "--peaks", "--peak-seqs", "100", "--peak-impls", "fmha_auto",
                      "--peak-timeout", "120")
    assert doc["config"]["dim_v"] == 40 and "64/40" in proc.stdout
    for r in doc["results"]:
        assert r["head_dim"] == 64 and r["head_dim_v"] == 40 and r["status"] == "ok", r
        if r.get("kind") == "peak":
            continue
        assert r["rel_err"] < (1e-5 if r["dtype"] == "float32" else 4e-3), r
        pairs = 200 if r["variant"] == "decode" else 200 * 200
        flops = 2 * 2 * pairs * (64 + 40) * (3.5 if r["mode"] == "fwdbwd" else 1)
        assert r["gflops"] == pytest.approx(flops / (r["median_ms"] * 1e6), rel=0.02), r
        size = 4 if r["dtype"] == "float32" else 2
        assert r["kv_gbs"] == pytest.approx(200 * (64 + 40) * size / (r["median_ms"] * 1e6), rel=0.02), r


def test_kv_dtype_rows(tmp_path):
    """--kv-dtype: bf16 or f16 K and V beside float32 rows, contiguous or
    paged; O is float32 against the float64 reference on the rounded K and V,
    K+V bandwidth counts 2-byte elements; the backward is unsupported; peak
    children get the option too."""
    for kv, page in (("bfloat16", []), ("float16", ["--page-size", "16"])):
        doc, _ = bench(tmp_path, "--seqs", "300", "--seq-q", "1", "--heads-kv", "1", "--kv-dtype", kv, *page,
                       "--modes", "fwd,fwdbwd", "--impls", "fmha_auto", "--variants", "causal", "--peaks",
                       "--peak-seqs", "200", "--peak-impls", "fmha_auto", "--peak-timeout", "120")
        assert doc["config"]["kv_dtype"] == kv
        for r in doc["results"]:
            assert r["kv_dtype"] == kv and r["dtype"] == "float32", r
            if r["mode"] == "fwdbwd":
                assert r["status"] == "unsupported"
                continue
            assert r["status"] == "ok", r
            if r.get("kind") != "peak":
                assert r["rel_err"] < 1e-5 and r["kv_gbs"] > 0, r


def test_no_ref_and_threads(tmp_path):
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--no-ref",
                   "--threads", "1")
    assert "rel_err" not in doc["results"][0]
    assert doc["config"]["no_ref"] is True
    assert doc["config"]["threads"] == 1 and doc["device"]["threads"] == 1


def test_peaks_in_child_processes(tmp_path):
    doc, proc = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--peaks",
                      "--peak-seqs", "64,128", "--peak-impls", "fmha_tiled,fmha_dense", "--peak-timeout", "120")
    peaks = [r for r in doc["results"] if r.get("kind") == "peak"]
    assert [(r["impl"], r["seq"]) for r in peaks] == [
        ("fmha_tiled", 64), ("fmha_dense", 64), ("fmha_tiled", 128), ("fmha_dense", 128)]
    for r in peaks:
        assert r["status"] == "ok", r
        assert 0.5 < r["peak_rss_mb"] < 200
        assert r["wall_s"] > 0 and r["median_ms"] > 0
    assert doc["config"]["peaks"] is True and doc["config"]["peak_seqs"] == "64,128"
    assert "peak_rss_mb=" in proc.stdout
    # the ceiling of decoding's K/V GB/s: a plausible read bandwidth
    assert 0.1 < doc["device"]["mem_read_gbs"] < 10000


def test_peak_timeout_kills_the_child(tmp_path):
    start = time.time()
    doc, _ = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--peaks",
                   "--peak-seqs", "128", "--peak-impls", "fmha_tiled", "--peak-timeout", "0.005",
                   "--min-sample-ms", "50")
    peak = [r for r in doc["results"] if r.get("kind") == "peak"]
    assert len(peak) == 1
    assert peak[0]["status"] == "timeout"
    assert "median_ms" not in peak[0]
    assert peak[0]["wall_s"] < 5
    assert time.time() - start < 60


def test_max_fit(tmp_path):
    budget_mb = 16
    doc, proc = bench(tmp_path, "--seqs", "64", "--modes", "fwd", "--impls", "fmha_tiled", "--max-fit",
                      "--fit-seqs", "64,128,1024,200000", "--fit-impls", "fmha_tiled,fmha_dense",
                      "--mem-budget-mb", str(budget_mb), "--peak-timeout", "60")
    fits = {r["impl"]: r for r in doc["results"] if r.get("kind") == "max_fit"}
    assert set(fits) == {"fmha_tiled", "fmha_dense"}
    for r in fits.values():
        assert r["status"] == "ok" and r["mode"] == "fwd" and r["dtype"] == "float32"
        assert r["budget_mb"] == budget_mb
        # The answer is the largest seq whose plan fits; bigger ones were over budget.
        checked = {c["seq"]: c for c in r["checked"]}
        assert r["max_fit_seq"] in checked and checked[r["max_fit_seq"]]["result"] == "fits"
        assert r["bytes"] <= budget_mb * 2**20
        for seq, c in checked.items():
            if seq > r["max_fit_seq"]:
                assert c["result"] == "over budget" and c["plan_mb"] > budget_mb
    # 200000 never fits in 16 MiB; 64 always does.
    assert 64 <= fits["fmha_tiled"]["max_fit_seq"] <= 1024
    assert 64 <= fits["fmha_dense"]["max_fit_seq"] <= fits["fmha_tiled"]["max_fit_seq"]
    assert "max_fit_seq=" in proc.stdout


# ---- the terminal table, shared with bench_peers ------------------------------------------

def _peers():
    from fmha.tools import bench_peers

    return bench_peers


def test_table_shows_spread_skipped_rows_and_time_left(tmp_path):
    """One table format for fmha-bench and bench_peers: the header is the
    same line; each row shows q1..q3 and the spread beside the median, '!'
    where the spread passes 25%; a skipped row is listed with its reason; the
    progress line gives the elapsed time and, after the first row, the time
    left."""
    peers = _peers()
    doc, proc = bench(tmp_path, "--seqs", "64,128", "--modes", "fwd", "--impls", "fmha_tiled,fmha_portable",
                      "--portable-max-seq", "64")
    lines = proc.stdout.splitlines()
    assert lines[0] == peers.TABLE_HEADER
    for r in doc["results"]:
        line = next(x for x in lines if x.startswith(r["impl"]) and f" {r['seq']} " in x and "skipped" not in x)
        assert line == peers.format_row(r)   # the same columns, numbers and flag
        spread = (r["q3_ms"] - r["q1_ms"]) / r["median_ms"]
        assert ("%.0f%%" % (100 * spread) + ("!" if spread > 0.25 else "")) in line
    skipped = [x for x in lines if "skipped" in x and x.startswith("fmha_portable")]
    assert len(skipped) == 1 and " 128 " in skipped[0]
    assert "runs up to --portable-max-seq 64" in skipped[0]
    assert "1 row skipped" in proc.stdout
    assert all(r["status"] != "skipped" for r in doc["results"])   # the results keep measured rows only
    progress = [x for x in proc.stderr.splitlines() if x.startswith("[row ")]
    assert len(progress) == 3 and all("elapsed " in x for x in progress)
    assert " left" not in progress[0] and all(" left" in x for x in progress[1:])


def test_table_flags_a_large_spread():
    peers = _peers()
    row = {"impl": "torch_sdpa", "mode": "fwd", "variant": "plain", "dtype": "float32", "head_dim": 64,
           "seq": 512, "status": "ok", "median_ms": 1.0, "q1_ms": 0.19, "q3_ms": 10.0, "gflops": 12.0}
    line = peers.format_row(row)
    assert "0.19..10" in line and "981%!" in line
    assert peers.table_notes([row])[0].startswith("! 1 row with q1..q3 wider than 25% of the median")
    quiet = dict(row, q1_ms=0.95, q3_ms=1.05)
    assert "10%" in peers.format_row(quiet) and "!" not in peers.format_row(quiet)
    assert peers.table_notes([quiet]) == []
    failed = {"impl": "torch_sdpa", "mode": "fwd", "variant": "plain", "dtype": "float32", "head_dim": 64,
              "seq": 512, "status": "unavailable", "error": "torch is not installed"}
    assert peers.format_row(failed).endswith("unavailable (torch is not installed)")


def test_progress_estimates_the_time_left():
    peers = _peers()
    assert peers.progress_line(1, 10, "x", 0.2) == "[row 1/10] x  elapsed 0:00"
    # 4 rows done in 80 s: 7 rows to go (this one included) take about 140 s.
    assert peers.progress_line(5, 11, "x", 80) == "[row 5/11] x  elapsed 1:20, ~2:20 left"
    assert peers.progress_line(2, 3, "x", 4000).endswith("elapsed 1:06:40, ~2:13:20 left")


def test_help_and_defaults_agree_with_bench_peers(tmp_path):
    """Both tools take bfloat16 and float16 (the help says so), and default
    to the same grid, variants and modes."""
    text = run(["--help"], tmp_path).stdout
    assert "float32 inputs" not in text and "bfloat16" in text and "float16" in text
    args = _peers().parse_args([])
    for flag, value in (("--seqs", args.seqs), ("--dims", args.dims), ("--dtypes", args.dtypes),
                        ("--variants", args.variants), ("--modes", args.modes)):
        line = next(x for x in text.splitlines() if x.strip().startswith(flag + " "))
        assert f"(default {','.join(map(str, value))})" in line, (flag, line)
