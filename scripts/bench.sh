#!/usr/bin/env bash
# bench.sh: the main job. Builds fmha optimised, runs fmha-bench on the
# seed's first configuration (seqs 128..2048, D = 64, float32, plain, fwd and
# fwdbwd, all four strategies) or on the grid its arguments give, measures
# the peers users run instead on the same grid (jax_xla always, torch_sdpa
# when PyTorch is installed in .venv), prints the table, writes the results
# file (results.json, or --out) and renders report/README.md from it.
#   usage: scripts/bench.sh [fmha-bench options]
# The grid options (--seqs --dims --dtypes --variants --modes --batch --heads
# --seq-q --heads-kv --threads --no-ref --note --min-samples --min-sample-ms)
# and --out go to both tools; the rest (--impls, --precision, --peaks, ...)
# to fmha-bench alone. --append adds to an existing results file.
set -euo pipefail
cd "$(dirname "$0")/.."

# Options that take a value, and those both tools understand.
valued=" --seqs --dims --dtypes --variants --modes --batch --heads --impls --seq-q --heads-kv --page-size
 --kv-dtype --portable-max-seq --threads --peak-seqs --peak-impls --peak-timeout --fit-seqs --fit-impls
 --mem-budget-mb --out --note --min-samples --min-sample-ms --child-row --precision "
shared=" --seqs --dims --dtypes --variants --modes --batch --heads --seq-q --heads-kv --threads --no-ref
 --note --min-samples --min-sample-ms "
grid=(--seqs 128,256,512,1024,2048 --dims 64 --dtypes float32 --variants plain --modes fwd,fwdbwd)
mine=() both=() out=results.json append=0
while (($#)); do
    flag=${1%%=*} value=
    if [[ "$1" == *=* ]]; then
        value=${1#*=}
        shift
    elif [[ "$valued" == *" $flag "* ]]; then
        (($# >= 2)) || { echo "bench.sh: $flag needs a value" >&2; exit 2; }
        value=$2
        shift 2
    else
        shift
    fi
    case "$flag" in
        --out) out=$value; continue ;;
        --append) append=1; continue ;;
    esac
    arg=("$flag"); [ -n "$value" ] && arg+=("$value")
    if [[ "$shared" == *" $flag "* ]]; then both+=("${arg[@]}"); else mine+=("${arg[@]}"); fi
done

scripts/setup.sh main
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
fresh=(); ((append)) && fresh=(--append)
# later options win: the caller's over the default grid
build/fmha-bench "${grid[@]}" --impls fmha_auto,fmha_dense,fmha_tiled,fmha_portable "${both[@]}" "${mine[@]}" \
    --out "$out" "${fresh[@]}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"   # the source tree's fmha package
peers=jax_xla
if .venv/bin/python -c "import torch" 2>/dev/null; then peers+=",torch_sdpa"; fi
echo "bench.sh: measuring the peers ($peers) on the same grid"
FMHA_LIBRARY="$PWD/build/libfmha.so" .venv/bin/python -m fmha.tools.bench_peers "${grid[@]}" "${both[@]}" \
    --impls "$peers" --out "$out" --append
.venv/bin/python -m fmha.tools.report "$out" -o report --print
echo "wrote $out and report/README.md"
