"""Tests of fmha.tools.report: a small record written here renders README.md whose
tables hold the record's numbers, the PNG charts exist and decode, rows that
did not run are listed and not plotted, and seed-style records get "(seed)"."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
try:
    from fmha.tools import report
except ImportError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "python"))
    from fmha.tools import report

import matplotlib.image as mpimg  # noqa: E402


def time_row(impl, seq, median_ms, mode="fwd", **extra):
    row = {"impl": impl, "mode": mode, "variant": "plain", "dtype": "float32", "batch": 1, "seq": seq,
           "heads": 8, "head_dim": 64, "status": "ok", "compile_s": 0.01, "inner": 10,
           "median_ms": median_ms, "q1_ms": median_ms * 0.9, "q3_ms": median_ms * 1.1, "rel_err": 2e-7,
           "temp_mb": 1.0, "arg_mb": 0.75, "out_mb": 0.25, "kind": "time"}
    row["gflops"] = 4 * 8 * seq * seq * 64 * (3.5 if mode == "fwdbwd" else 1) / 1e9 / (median_ms * 1e-3)
    row.update(extra)
    return row


def record(rows, peak_gflops=None):
    device = {"cpu": "Test CPU", "isa": "avx2", "threads": 2, "compiler": "gcc 12", "fmha_version": "0.1.0",
              "git_commit": "abc1234"}
    if peak_gflops:
        device["peak_gflops"] = peak_gflops
    config = {"device": "cpu", "seqs": "128,256"}
    return {"device": device, "config": config, "results": rows, "configs": [config], "note": "test record"}


def sample_rows():
    return [
        time_row("fmha_tiled", 128, 1.5),
        time_row("fmha_dense", 128, 3.0),
        time_row("fmha_tiled", 256, 4.25),
        time_row("fmha_dense", 256, 2.125),
        time_row("fmha_tiled", 128, 7.5, mode="fwdbwd"),
        time_row("torch_sdpa", 128, 0.75),
        {**time_row("fmha_tiled", 4096, 250.0), "kind": "peak", "peak_rss_mb": 42.5, "wall_s": 3.25},
        {"kind": "max_fit", "impl": "fmha_tiled", "mode": "fwd", "dtype": "float32", "batch": 1, "heads": 8,
         "head_dim": 64, "budget_mb": 1000, "status": "ok", "max_fit_seq": 65536, "bytes": 500 * 2**20},
        {"impl": "fmha_tiled", "mode": "fwd", "variant": "masked_bias", "dtype": "float32", "batch": 1,
         "seq": 128, "heads": 8, "head_dim": 64, "status": "unsupported", "error": "not in the library yet"},
        {**time_row("fmha_dense", 8192, 1.0), "kind": "peak", "status": "timeout", "median_ms": None},
    ]


def write(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def pngs(out):
    return sorted(p.name for p in out.glob("*.png"))


def assert_decodes(path):
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_report_renders_tables_and_charts(tmp_path):
    path = write(tmp_path, "results.json", record(sample_rows(), peak_gflops=100.0))
    out = tmp_path / "report"
    assert report.main([str(path), "-o", str(out)]) == 0
    text = (out / "README.md").read_text()

    # One table per (variant, dtype, head dim, mode); numbers and ratios from the file.
    assert "## plain, float32, head dim 64, fwd (batch 1, 8 heads)" in text
    assert "## plain, float32, head dim 64, fwdbwd (batch 1, 8 heads)" in text
    table = text.split("## plain, float32, head dim 64, fwd (")[1].split("##")[0]
    header = next(line for line in table.splitlines() if line.startswith("| seq"))
    assert header == "| seq | fmha_dense | fmha_tiled | torch_sdpa |"
    row128 = next(line for line in table.splitlines() if line.startswith("| 128 |"))
    assert "3 ms (4.00x)" in row128 and "1.5 ms (2.00x)" in row128 and "**0.75 ms (1.00x)**" in row128
    row256 = next(line for line in table.splitlines() if line.startswith("| 256 |"))
    assert "**2.125 ms (1.00x)**" in row256 and "4.25 ms (2.00x)" in row256
    # The peak row's timing fills seq 4096.
    assert "| 4096 |" in table and "250 ms" in table

    assert "42.5" in text and "3.25" in text          # peak memory table
    assert "65536" in text and "| 500 |" in text     # max-fit table
    # Rows that did not run are listed, not plotted.
    listed = text.split("## Rows not plotted")[1]
    assert "unsupported" in listed and "not in the library yet" in listed and "timeout" in listed
    assert "masked_bias" not in text.split("## Rows not plotted")[0]

    names = pngs(out)
    assert "time_plain_float32_d64_fwd_b1_h8.png" in names
    assert "memory_plain_float32_d64_fwd_b1_h8.png" in names
    assert "peak_fraction_plain_float32_d64_fwd_b1_h8.png" in names
    assert "time_plain_float32_d64_fwdbwd_b1_h8.png" in names
    for name in names:
        assert f"]({name})" in text
        assert_decodes(out / name)


def test_fraction_of_peak_is_skipped_without_a_peak(tmp_path):
    path = write(tmp_path, "results.json", record(sample_rows()))
    out = tmp_path / "report"
    assert report.main([str(path), "-o", str(out)]) == 0
    text = (out / "README.md").read_text()
    assert "fraction-of-peak charts are skipped" in text
    assert not [n for n in pngs(out) if n.startswith("peak_fraction")]
    # --peak-gflops supplies it.
    out2 = tmp_path / "report2"
    assert report.main([str(path), "-o", str(out2), "--peak-gflops", "50"]) == 0
    assert [n for n in pngs(out2) if n.startswith("peak_fraction")]


def test_seed_rows_are_labelled_as_another_machine(tmp_path):
    ours = write(tmp_path, "results.json", record(sample_rows()[:4]))
    seed_doc = {
        "device": {"jax": "0.0", "backend": "cpu", "gpu": "some GPU"},
        "config": {"device": "cpu"},
        "results": [
            {"impl": "xla_tiled", "mode": "fwd", "variant": "plain", "dtype": "float32", "batch": 1, "seq": 128,
             "heads": 8, "head_dim": 64, "xla_temp_mb": 1.25, "xla_arg_mb": 0.75, "xla_out_mb": 0.25,
             "compile_s": 0.003, "inner": 100, "median_ms": 0.375, "q1_ms": 0.3, "q3_ms": 0.4, "rel_err": 3e-7},
            {"impl": "torch_sdpa", "mode": "fwd", "variant": "plain", "dtype": "float32", "batch": 1, "seq": 128,
             "heads": 8, "head_dim": 64, "compile_s": 0.001, "inner": 200, "median_ms": 0.0625, "q1_ms": 0.06,
             "q3_ms": 0.07, "rel_err": 3e-7},
        ],
        "configs": [],
        "note": "seed note",
    }
    seed = write(tmp_path, "attention-benchmark-record.json", seed_doc)
    out = tmp_path / "report"
    assert report.main([str(ours), str(seed), "-o", str(out)]) == 0
    text = (out / "README.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| seq"))
    assert header == "| seq | fmha_dense | fmha_tiled | xla_tiled (seed) | torch_sdpa (seed) |"
    assert "0.375 ms (6.00x)" in text and "**0.0625 ms (1.00x)**" in text
    # Ratios compare rows of one machine: ours against ours.
    assert "**1.5 ms (1.00x)**" in text and "3 ms (2.00x)" in text
    assert "seed note" in text
    for name in pngs(out):
        assert_decodes(out / name)


def test_the_real_seed_record_renders(tmp_path):
    seed = ROOT.parent / "shared" / "seed" / "attention-benchmark-record.json"
    if not seed.is_file():
        pytest.skip("the seed record is not in shared/")
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "fmha.tools.report", str(seed), "-o", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 0, proc.stderr
    text = (out / "README.md").read_text()
    assert "probjax_mha (seed)" in text and "masked_bias" in text
    assert len(pngs(out)) >= 12


def test_bad_input_is_an_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert report.main([str(bad), "-o", str(tmp_path / "out")]) == 1
    assert report.main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "out")]) == 1


def test_peer_table_compares_fmha_auto_with_the_faster_peer(tmp_path, capsys):
    rows = [
        time_row("fmha_auto", 128, 0.5), time_row("jax_xla", 128, 2.0), time_row("torch_sdpa", 128, 1.5),
        time_row("fmha_auto", 256, 1.0), time_row("jax_xla", 256, 3.0),
        time_row("fmha_auto", 128, 2.0, mode="fwdbwd"),   # no peer on this row: left out
    ]
    path = write(tmp_path, "results.json", record(rows))
    out = tmp_path / "report"
    assert report.main([str(path), "-o", str(out), "--print"]) == 0
    printed = capsys.readouterr().out
    for text in (printed, (out / "README.md").read_text()):
        assert "| plain | float32 | 64 | fwd | 128 | 0.5 | torch_sdpa 1.5 | 3.00x |" in text
        assert "| plain | float32 | 64 | fwd | 256 | 1 | jax_xla 3 | 3.00x |" in text
        assert "| fwdbwd |" not in text.split("## plain")[0]


def test_peer_table_absent_without_peer_rows(tmp_path, capsys):
    path = write(tmp_path, "results.json", record([time_row("fmha_auto", 128, 0.5)]))
    assert report.main([str(path), "-o", str(tmp_path / "report"), "--print"]) == 0
    assert "no peer rows to compare with" in capsys.readouterr().out
    assert "against what users run today" not in (tmp_path / "report" / "README.md").read_text()


def test_decode_rows_get_tables_of_their_own(tmp_path, capsys):
    """Rows with a query length or kv heads of their own are not mixed with
    the square rows of the same seq: their own section and peer lines."""
    rows = [
        time_row("fmha_auto", 4096, 10.0), time_row("torch_sdpa", 4096, 20.0),
        time_row("fmha_auto", 4096, 0.5, seq_q=1, heads_kv=2), time_row("torch_sdpa", 4096, 2.0, seq_q=1, heads_kv=2),
    ]
    path = write(tmp_path, "results.json", record(rows))
    out = tmp_path / "report"
    assert report.main([str(path), "-o", str(out), "--print"]) == 0
    text = (out / "README.md").read_text()
    assert "| plain | float32 | 64 | fwd | 4096 | 10 | torch_sdpa 20 | 2.00x |" in text
    assert "| plain, Sq=1, Hkv=2 | float32 | 64 | fwd | 4096 | 0.5 | torch_sdpa 2 | 4.00x |" in text
    assert "## plain, float32, head dim 64, fwd (batch 1, 8 heads, Sq=1, Hkv=2)" in text
    capsys.readouterr()


@pytest.mark.parametrize("name", ["fmha.report", "fmha.bench_peers"])
def test_former_module_names_run_the_tools(name, tmp_path):
    """python -m fmha.report / fmha.bench_peers run fmha.tools' modules, and
    importing the former names reaches the tools' functions."""
    import importlib

    tool = name.replace("fmha.", "fmha.tools.")
    assert importlib.import_module(name).main is importlib.import_module(tool).main
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run([sys.executable, "-m", name, "--help"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m {tool} ")
    if name == "fmha.report":  # and the former name renders a report as the tool does
        bad = tmp_path / "bad.json"
        bad.write_text("[1, 2")
        proc = subprocess.run([sys.executable, "-m", name, str(bad), "-o", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1 and proc.stderr.startswith("fmha.report: ")


def test_without_matplotlib_the_tables_print_and_the_extra_is_named(tmp_path):
    """python -m fmha.report --print with matplotlib not importable: the
    tables print and README.md is written without charts; the message names
    the extra that adds them (no traceback)."""
    rows = [time_row("fmha_auto", 128, 0.5), time_row("torch_sdpa", 128, 1.5), time_row("fmha_tiled", 128, 0.6)]
    path = write(tmp_path, "results.json", record(rows))
    out = tmp_path / "report"
    blocker = ("import runpy, sys; sys.modules['matplotlib'] = None; "   # import matplotlib raises ImportError
               "sys.argv = ['fmha.report', *sys.argv[1:]]; runpy.run_module('fmha.report', run_name='__main__')")
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run([sys.executable, "-c", blocker, str(path), "-o", str(out), "--print"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "| plain | float32 | 64 | fwd | 128 | 0.5 | torch_sdpa 1.5 | 3.00x |" in proc.stdout
    assert "pip install 'fmha[report]'" in proc.stderr
    text = (out / "README.md").read_text()
    assert "0.6 ms" in text and "pip install 'fmha[report]'" in text
    assert not pngs(out)


def test_readme_table_from_a_record(tmp_path, capsys):
    """--readme prints fmha_auto beside each peer present (none invented: a
    peer without rows has no column) and the speedup over the faster one,
    with the CPU the rows came from; --seqs keeps the lengths given."""
    rows = [time_row("fmha_auto", 128, 0.5), time_row("jax_xla", 128, 2.0), time_row("torch_sdpa", 128, 1.5),
            time_row("fmha_auto", 256, 1.0), time_row("jax_xla", 256, 3.0), time_row("fmha_auto", 512, 4.0)]
    path = write(tmp_path, "results.json", record(rows))
    assert report.main([str(path), "--readme", "-o", str(tmp_path / "unused")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| dtype | variant | mode | S | fmha | PyTorch SDPA | JAX (jax.nn, XLA) | fmha vs faster peer |"
    assert "| float32 | plain | fwd | 128 | 0.5 | 1.5 | 2 | **3.00x** |" in lines
    assert "| float32 | plain | fwd | 256 | 1 | - | 3 | **3.00x** |" in lines
    assert not [x for x in lines if "| 512 |" in x]   # no peer beside it
    assert "llama.cpp" not in lines[0]
    assert lines[-1].startswith("Median ms per call, B 1, H 8, D 64, measured on Test CPU, 2 threads")
    assert not (tmp_path / "unused").exists()
    assert report.main([str(path), "--readme", "--seqs", "256"]) == 0
    assert "| 128 |" not in capsys.readouterr().out


def test_readme_table_of_the_checked_in_measurements_renders():
    for path in sorted((ROOT / "docs" / "bench").glob("*.json")):
        table = report.readme_table([report.load_source(str(path), None)])
        assert table and all(line.count("|") >= 8 for line in table[:-2]), path


def test_project_readme_table_is_the_reports(monkeypatch):
    """The speed table of the project's README is what --readme --seqs 2048
    renders from docs/bench/ (regenerate it there after a new measurement)."""
    monkeypatch.chdir(ROOT)
    sources = [report.load_source(str(p.relative_to(ROOT)), None) for p in sorted((ROOT / "docs" / "bench").glob("*.json"))]
    table = "\n".join(report.readme_table(sources, {2048}))
    assert table in (ROOT / "README.md").read_text()
