"""fmha.tools.report: turns fmha-bench records into report/README.md and PNG charts.

    python -m fmha.tools.report results.json [more.json ...] -o report/ [--peak-gflops G]
    (python -m fmha.report runs it too)

Accepts fmha-bench records, records holding peer rows (jax_xla, torch_sdpa)
and the seed record (attention-benchmark-record.json), whose rows ran on
another machine and are labelled "<impl> (seed)". Per (variant, dtype, head
dim, mode) it writes a table of median ms and the ratio to the fastest impl
at each sequence length, and three charts: time vs sequence length, memory vs
sequence length, and the achieved fraction of the machine's peak GFLOP/s
(from --peak-gflops or a "peak_gflops" in a record's device; skipped with a
note when unknown). Rows whose status is not ok are listed, not plotted.
When the records hold peer rows of this machine, a first table compares
fmha_auto with the faster peer per row; --print also writes it to stdout.
Without matplotlib the report has its tables and no charts (pip install
'fmha[report]' adds it). --readme prints the project README's speed table
instead (python -m fmha.tools.report docs/bench/*.json --readme --seqs 512,2048).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

CHARTS_EXTRA = "pip install 'fmha[report]'"   # matplotlib, for the charts


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not
    installed (the report then has its tables and no charts)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt

FMHA_IMPLS = ["fmha_auto", "fmha_dense", "fmha_tiled", "fmha_portable", "fmha_plan"]
PEER_IMPLS = ["jax_xla", "torch_sdpa"]   # what users run instead of fmha
SEED_IMPLS = {"probjax_mha", "xla_dense", "xla_tiled", "mha_interpret"}
SEED_FILE_NAME = "attention-benchmark-record.json"
SEED_SUFFIX = " (seed)"


@dataclass
class Row:
    """One result row, normalised across record formats."""

    label: str          # impl, suffixed " (seed)" for rows from the seed record
    kind: str           # time, peak or max_fit
    status: str
    raw: dict
    source: str         # the file it came from
    peak_gflops: float | None  # of the machine it ran on, when known

    def get(self, key, default=None):
        return self.raw.get(key, default)

    @property
    def seq(self) -> int:
        try:
            return int(self.raw.get("seq") or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def group(self):
        """(variant, dtype, head dim, mode, batch, heads, query length, kv heads,
        value head dim): rows comparable in one table. The last three are 0
        when absent (the query length is the seq, the kv heads are the heads,
        V's head dim is the head dim)."""
        return (
            str(self.get("variant", "plain")),
            str(self.get("dtype", "float32")),
            int(self.get("head_dim", 0) or 0),
            str(self.get("mode", "fwd")),
            int(self.get("batch", 1) or 1),
            int(self.get("heads", 0) or 0),
            int(self.get("seq_q", 0) or 0),
            int(self.get("heads_kv", 0) or 0),
            int(self.get("head_dim_v", 0) or 0),
        )


@dataclass
class Source:
    path: str
    is_seed: bool
    device: dict
    note: str
    rows: list = field(default_factory=list)


def is_seed_record(path: str, doc: dict) -> bool:
    """The seed record ran on another machine (JAX/XLA on a GPU host)."""
    if os.path.basename(path) == SEED_FILE_NAME:
        return True
    return any(r.get("impl") in SEED_IMPLS for r in doc.get("results", []) if isinstance(r, dict))


def row_kind(row: dict) -> str:
    kind = row.get("kind")
    if kind in ("time", "peak", "max_fit"):
        return kind
    if "max_fit_seq" in row:
        return "max_fit"
    if "peak_rss_mb" in row or "wall_s" in row:
        return "peak"
    return "time"


def load_source(path: str, peak_gflops_arg: float | None) -> Source:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("results", []), list):
        raise ValueError(f"{path}: not a benchmark record (an object with a 'results' list)")
    seed = is_seed_record(path, doc)
    device = doc.get("device") if isinstance(doc.get("device"), dict) else {}
    peak = device.get("peak_gflops")
    if not seed and peak_gflops_arg:
        peak = peak_gflops_arg
    source = Source(path, seed, device, str(doc.get("note", "")))
    for raw in doc.get("results", []):
        if not isinstance(raw, dict) or "impl" not in raw:
            continue
        label = str(raw["impl"]) + (SEED_SUFFIX if seed else "")
        status = str(raw.get("status", "ok"))
        # bf16 rows are judged against the bf16 dot-product ceiling when known
        row_peak = peak
        if raw.get("dtype") == "bfloat16" and device.get("peak_gflops_bf16") and not seed:
            row_peak = device["peak_gflops_bf16"]
        source.rows.append(Row(label, row_kind(raw), status, raw, path, row_peak))
    return source


def impl_order(labels) -> list:
    """fmha's strategies first, then peers, then the seed's rows."""
    labels = list(dict.fromkeys(labels))

    def key(label):
        base = label[: -len(SEED_SUFFIX)] if label.endswith(SEED_SUFFIX) else label
        seed = label.endswith(SEED_SUFFIX)
        rank = FMHA_IMPLS.index(base) if base in FMHA_IMPLS else len(FMHA_IMPLS)
        return (seed, rank, labels.index(label))

    return sorted(labels, key=key)


def flops(row: Row) -> float:
    """2*B*H*Sq*S*(D + Dv) forward (4*B*H*Sq*S*D when Dv = D; scores seen:
    half when causal and square, per query under bottom-right), x3.5 for
    fwdbwd."""
    b = float(row.get("batch", 1) or 1)
    h = float(row.get("heads", 1) or 1)
    s = float(row.get("seq", 0) or 0)
    d = float(row.get("head_dim", 0) or 0)
    sq = float(row.get("seq_q") or s)
    if row.get("variant") in ("causal", "decode") and sq == s:
        pairs = 0.5 * s * s
    elif row.get("variant") in ("causal", "decode"):  # bottom-right: query i sees i + S - Sq + 1 keys
        pairs = sum(min(s, max(0.0, i + s - sq + 1)) for i in range(int(sq)))
    else:
        pairs = sq * s
    dv = float(row.get("head_dim_v") or d)
    f = 2.0 * b * h * pairs * (d + dv)
    if row.get("mode") == "fwdbwd":
        f *= 3.5
    return f


def gflops_of(row: Row) -> float | None:
    g = row.get("gflops")
    if isinstance(g, (int, float)) and g > 0:
        return float(g)
    ms = row.get("median_ms")
    if isinstance(ms, (int, float)) and ms > 0:
        return flops(row) / 1e9 / (ms * 1e-3)
    return None


def memory_mb(row: Row) -> float | None:
    """peak_rss_mb when measured, else the plan: temp + args + outputs."""
    peak = row.get("peak_rss_mb")
    if isinstance(peak, (int, float)):
        return float(peak)
    parts = []
    for key in ("temp_mb", "arg_mb", "out_mb"):
        v = row.get(key, row.get("xla_" + key))
        if isinstance(v, (int, float)):
            parts.append(float(v))
    return sum(parts) if parts else None


def fmt(x, digits=4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if abs(x) >= 10**digits:  # no exponent for large values
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def group_order(group):
    """plain, causal, masked_bias, decode; float32 first; then head dim, fwd before fwdbwd."""
    variant, dtype, dim, mode, batch, heads, seq_q, heads_kv, dim_v = group
    ranks = {"plain": 0, "causal": 1, "masked_bias": 2, "decode": 3}
    return (ranks.get(variant, 3), variant, dtype != "float32", dtype, dim, mode, batch, heads, seq_q, heads_kv,
            dim_v)


def shape_suffix(group, sep=", ") -> str:
    """The query length, kv heads and V's head dim of a group when they
    differ from seq, heads and the head dim."""
    seq_q, heads_kv, dim_v = group[6], group[7], group[8]
    parts = (([f"Sq={seq_q}"] if seq_q else []) + ([f"Hkv={heads_kv}"] if heads_kv else [])
             + ([f"Dv={dim_v}"] if dim_v else []))
    return "".join(sep + p for p in parts)


def slug(group) -> str:
    variant, dtype, dim, mode, batch, heads = group[:6]
    return f"{variant}_{dtype}_d{dim}_{mode}_b{batch}_h{heads}" + shape_suffix(group, "_").lower().replace("=", "")


def timing_rows(rows):
    """The ok rows with a median, one per (label, group, seq): time rows
    win over peak rows, later rows over earlier ones."""
    chosen = {}
    for row in rows:
        if row.status != "ok" or row.kind == "max_fit":
            continue
        if not isinstance(row.get("median_ms"), (int, float)):
            continue
        key = (row.label, row.group, row.seq)
        old = chosen.get(key)
        if old is None or not (old.kind == "time" and row.kind == "peak"):
            chosen[key] = row
    return list(chosen.values())


def time_table(group_rows) -> list:
    """Markdown lines: one row per seq, one column per impl."""
    labels = impl_order(r.label for r in group_rows)
    seqs = sorted({r.seq for r in group_rows})
    cell = {(r.label, r.seq): r for r in group_rows}
    lines = [
        "| seq | " + " | ".join(labels) + " |",
        "|---:|" + "---:|" * len(labels),
    ]
    for seq in seqs:
        # Ratios compare rows of one machine: the seed's among themselves.
        fastest_of = {}
        for lab in labels:
            if (lab, seq) in cell:
                machine = lab.endswith(SEED_SUFFIX)
                ms = cell[(lab, seq)].get("median_ms")
                fastest_of[machine] = min(ms, fastest_of.get(machine, ms))
        cells = []
        for lab in labels:
            r = cell.get((lab, seq))
            if r is None:
                cells.append("-")
                continue
            ms = r.get("median_ms")
            fastest = fastest_of[lab.endswith(SEED_SUFFIX)]
            text = f"{fmt(ms)} ms ({ms / fastest:.2f}x)" if fastest else f"{fmt(ms)} ms"
            if ms == fastest:
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {seq} | " + " | ".join(cells) + " |")
    return lines


def peer_table(timed) -> list:
    """Markdown lines: fmha_auto against the faster peer of this machine,
    one line per (group, seq) that has both; [] when there is no peer row."""
    cell = {(r.label, r.group, r.seq): r.get("median_ms") for r in timed}
    lines = []
    for group in sorted({r.group for r in timed}, key=group_order):
        variant, dtype, dim, mode = group[:4]
        for seq in sorted({r.seq for r in timed if r.group == group}):
            ours = cell.get(("fmha_auto", group, seq))
            peers = {p: cell[(p, group, seq)] for p in PEER_IMPLS if (p, group, seq) in cell}
            if ours is None or not peers:
                continue
            best = min(peers, key=peers.get)
            lines.append(f"| {variant}{shape_suffix(group)} | {dtype} | {dim} | {mode} | {seq} | {fmt(ours)} | "
                         f"{best} {fmt(peers[best])} | {peers[best] / ours:.2f}x |")
    if not lines:
        return []
    return ["| variant | dtype | D | mode | seq | fmha_auto ms | faster peer ms | speedup |",
            "|---|---|---:|---|---:|---:|---:|---:|"] + lines


# The README's comparison: fmha_auto beside what users run instead, in this order.
README_PEERS = [("torch_sdpa", "PyTorch SDPA"), ("jax_xla", "JAX (jax.nn, XLA)"),
                ("ggml_flash_attn", "llama.cpp (ggml flash attn)")]


def readme_table(sources, seqs=None) -> list:
    """Markdown lines for the project README: per (dtype, variant, mode,
    seq) fmha_auto's median ms beside each peer present in the records and
    the speedup over the faster peer; then the machine the rows came from.
    seqs: keep only these sequence lengths (None: all)."""
    timed = [r for r in timing_rows([r for s in sources for r in s.rows]) if not seqs or r.seq in seqs]
    cell = {(r.label, r.group, r.seq): r.get("median_ms") for r in timed}
    peers = [(impl, name) for impl, name in README_PEERS if any(r.label == impl for r in timed)]
    lines = []
    for group in sorted({r.group for r in timed}, key=group_order):
        variant, dtype, dim, mode, batch, heads = group[:6]
        for seq in sorted({r.seq for r in timed if r.group == group}):
            ours = cell.get(("fmha_auto", group, seq))
            theirs = {impl: cell.get((impl, group, seq)) for impl, _ in peers}
            measured = [ms for ms in theirs.values() if ms]
            if ours is None or not measured:
                continue
            cells = [f"{fmt(theirs[impl], 3)}" if theirs[impl] else "-" for impl, _ in peers]
            lines.append(f"| {dtype} | {variant}{shape_suffix(group)} | {mode} | {seq} | {fmt(ours, 3)} | "
                         + " | ".join(cells) + f" | **{min(measured) / ours:.2f}x** |")
    if not lines:
        return []
    head = ["| dtype | variant | mode | S | fmha | " + " | ".join(name for _, name in peers) + " | fmha vs faster peer |",
            "|---|---|---|---:|---:|" + "---:|" * len(peers) + "---:|"]
    shapes = sorted({(g[4], g[5], g[2]) for g in (r.group for r in timed)})
    where = []
    for s in sources:
        if any(r in timed for r in s.rows):
            d = s.device
            threads = f", {d['threads']} threads" if "threads" in d else ""
            where.append(f"{d.get('cpu', 'an unknown CPU')}{threads} (`{s.path}`)")
    shape_text = "; ".join(f"B {b}, H {h}, D {dim}" for b, h, dim in shapes)
    return head + lines + ["", f"Median ms per call, {shape_text}, measured on " + "; ".join(where) + "."]


def error_summary(group_rows) -> str:
    worst = {}
    for r in group_rows:
        e = r.get("rel_err")
        if isinstance(e, (int, float)):
            worst[r.label] = max(worst.get(r.label, 0.0), float(e))
    if not worst:
        return ""
    parts = [f"{lab} {worst[lab]:.2e}" for lab in impl_order(worst)]
    return "Largest rel_err against the float64 reference: " + ", ".join(parts) + "."


_COLORS = {}


def color_of(label: str):
    """One colour per impl across every chart (a peak-RSS line shares its impl's)."""
    base = label.replace(" peak RSS", "")
    if base not in _COLORS:
        palette = pyplot().get_cmap("tab20").colors
        _COLORS[base] = palette[(2 * len(_COLORS)) % 20 + (len(_COLORS) // 10) % 2]
    return _COLORS[base]


def plot_lines(series, title, ylabel, path, logy=True):
    """series: {label: [(seq, value), ...]}. Log-log in seq (and y when logy)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for label in impl_order(series):
        points = sorted(p for p in series[label] if p[1] is not None and p[1] > 0)
        if not points:
            continue
        xs, ys = zip(*points)
        style = ":" if label.endswith(" peak RSS") else "--" if SEED_SUFFIX in label else "-"
        ax.plot(xs, ys, style, marker="o", markersize=4, label=label, color=color_of(label))
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def group_charts(rows, group, group_rows, title, prefix, name) -> list:
    """Draws a group's charts (time, memory, fraction of peak when known) as
    prefix + <chart>_<name>.png; returns their markdown lines."""
    lines = []
    series = {}
    for r in group_rows:
        series.setdefault(r.label, []).append((r.seq, float(r.get("median_ms"))))
    plot_lines(series, f"time: {title}", "median ms per call", prefix + f"time_{name}.png")
    lines.append(f"![time {title}](time_{name}.png)")

    mem = {}
    for r in rows:
        if r.status != "ok" or r.kind == "max_fit" or r.group != group:
            continue
        label = r.label + (" peak RSS" if r.kind == "peak" and r.get("peak_rss_mb") is not None else "")
        mem.setdefault(label, {})[r.seq] = memory_mb(r)
    mem = {k: list(v.items()) for k, v in mem.items()}
    plot_lines(mem, f"memory: {title}", "MB (temp + args + outputs, or peak RSS)",
               prefix + f"memory_{name}.png")
    lines.append(f"![memory {title}](memory_{name}.png)")

    fraction = {}
    for r in group_rows:
        g = gflops_of(r)
        if r.peak_gflops and g:
            fraction.setdefault(r.label, []).append((r.seq, g / r.peak_gflops))
    if fraction:
        plot_lines(fraction, f"fraction of peak: {title}", "achieved GFLOP/s / peak GFLOP/s",
                   prefix + f"peak_fraction_{name}.png", logy=False)
        lines.append(f"![fraction of peak {title}](peak_fraction_{name}.png)")
    return lines


def render(sources, out_dir, peak_gflops_arg=None) -> str:
    """Writes README.md and the charts under out_dir (tables only when
    matplotlib is not installed); returns README's path."""
    os.makedirs(out_dir, exist_ok=True)
    charts = pyplot() is not None
    rows = [r for s in sources for r in s.rows]
    timed = timing_rows(rows)
    md = ["# fmha benchmark report", ""]

    md += ["## Sources", ""]
    for s in sources:
        d = s.device
        if s.is_seed:
            what = "seed record, another machine; its rows are labelled \"(seed)\""
        else:
            what = ", ".join(
                f"{k} {d[k]}" for k in ("cpu", "isa", "threads", "compiler", "fmha_version", "git_commit")
                if k in d
            ) or "no device information"
        md.append(f"- `{s.path}`: {len(s.rows)} rows; {what}.")
        if s.note:
            md.append(f"  Note: {s.note}")
    md.append("")

    versus = peer_table(timed)
    if versus:
        md += ["## fmha against what users run today", "",
               "fmha_auto's median against the faster of " + ", ".join(PEER_IMPLS) +
               " on the same row of this machine (speedup = peer time / fmha time).", ""]
        md += versus + [""]

    groups = sorted({r.group for r in timed}, key=group_order)
    if charts:
        for label in impl_order(r.label for r in rows):
            color_of(label)
    else:
        md += [f"No charts: matplotlib is not installed ({CHARTS_EXTRA} adds it).", ""]
    any_peak = any(r.peak_gflops for r in timed)
    if charts and not any_peak:
        md += [
            "The fraction-of-peak charts are skipped: the machine's peak GFLOP/s is unknown "
            "(pass --peak-gflops or add \"peak_gflops\" to the record's device).",
            "",
        ]
    for group in groups:
        variant, dtype, dim, mode, batch, heads = group[:6]
        group_rows = [r for r in timed if r.group == group]
        md += [f"## {variant}, {dtype}, head dim {dim}, {mode} (batch {batch}, {heads} heads{shape_suffix(group)})",
               ""]
        md += ["Median ms per call and, in brackets, the ratio to the fastest impl at that sequence "
               "length on the same machine (seed rows are compared among themselves); fastest in bold.", ""]
        md += time_table(group_rows)
        summary = error_summary(group_rows)
        md += ["", summary] if summary else []
        md.append("")
        name = slug(group)
        title = f"{variant}, {dtype}, D={dim}, {mode}, B={batch}, H={heads}{shape_suffix(group)}"

        if charts:
            md += group_charts(rows, group, group_rows, title, os.path.join(out_dir, ""), name)
        md.append("")

    peaks = [r for r in rows if r.kind == "peak" and r.status == "ok"]
    if peaks:
        md += ["## Peak memory (one child process per row)", ""]
        md += ["| impl | mode | variant | dtype | D | seq | peak RSS MB | wall s | median ms |",
               "|---|---|---|---|---:|---:|---:|---:|---:|"]
        for r in sorted(peaks, key=lambda r: (r.group, r.seq, r.label)):
            md.append(
                f"| {r.label} | {r.get('mode')} | {r.get('variant')} | {r.get('dtype')} | {r.get('head_dim')} | "
                f"{r.get('seq')} | {fmt(r.get('peak_rss_mb'))} | {fmt(r.get('wall_s'), 3)} | "
                f"{fmt(r.get('median_ms'))} |"
            )
        md.append("")

    fits = [r for r in rows if r.kind == "max_fit" and r.status == "ok"]
    if fits:
        md += ["## Largest sequence whose memory plan fits", ""]
        md += ["| impl | mode | dtype | D | max fit seq | plan MB | budget MB |",
               "|---|---|---|---:|---:|---:|---:|"]
        for r in fits:
            b = r.get("bytes")
            md.append(
                f"| {r.label} | {r.get('mode')} | {r.get('dtype')} | {r.get('head_dim')} | "
                f"{r.get('max_fit_seq') if r.get('max_fit_seq') is not None else 'none'} | "
                f"{fmt(b / 2**20 if isinstance(b, (int, float)) else None)} | {fmt(r.get('budget_mb'))} |"
            )
        md.append("")

    other = [r for r in rows if r.status != "ok"]
    if other:
        md += ["## Rows not plotted (status other than ok)", ""]
        md += ["| impl | kind | mode | variant | dtype | D | seq | status | detail |",
               "|---|---|---|---|---|---:|---:|---|---|"]
        for r in other:
            detail = str(r.get("error", "")).replace("|", "/")
            md.append(
                f"| {r.label} | {r.kind} | {r.get('mode', '-')} | {r.get('variant', '-')} | {r.get('dtype', '-')} | "
                f"{r.get('head_dim', '-')} | {r.get('seq', '-')} | {r.status} | {detail} |"
            )
        md.append("")

    readme = os.path.join(out_dir, "README.md")
    with open(readme, "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    return readme


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmha.tools.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", help="fmha-bench JSON records (the seed record too)")
    parser.add_argument("-o", "--out", default="report", help="output folder (default report/)")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="this machine's peak GFLOP/s, for the fraction-of-peak charts")
    parser.add_argument("--print", action="store_true", dest="print_versus",
                        help="also print the fmha-against-peers table to stdout")
    parser.add_argument("--readme", action="store_true",
                        help="print the project README's speed table (fmha_auto beside PyTorch SDPA, JAX and "
                             "llama.cpp's ggml where measured) to stdout and write nothing")
    parser.add_argument("--seqs", default=None,
                        help="with --readme: only these sequence lengths (comma-separated)")
    args = parser.parse_args(argv)
    try:
        seqs = {int(x) for x in args.seqs.split(",")} if args.seqs else None
    except ValueError:
        parser.error(f"--seqs wants comma-separated integers, got '{args.seqs}'")
    try:
        sources = [load_source(path, args.peak_gflops) for path in args.records]
    except (OSError, ValueError) as e:
        print(f"fmha.report: {e}", file=sys.stderr)
        return 1
    if args.readme:
        table = readme_table(sources, seqs)
        print("\n".join(table) if table else "fmha.report: no fmha_auto row with a peer beside it")
        return 0
    readme = render(sources, args.out, args.peak_gflops)
    if pyplot() is None:
        print(f"fmha.report: matplotlib is not installed: {readme} has the tables and no charts "
              f"({CHARTS_EXTRA} for charts)", file=sys.stderr)
    if args.print_versus:
        versus = peer_table(timing_rows([r for s in sources for r in s.rows]))
        print("\n".join(versus) if versus else "fmha.report: no peer rows to compare with")
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
