#!/usr/bin/env bash
# bench.sh: the main job. Builds fmha optimised, runs fmha-bench on the
# seed's first configuration (seqs 128..2048, D = 64, float32, plain, fwd and
# fwdbwd, all four strategies), measures the peers users run instead on the
# same grid (jax_xla always, torch_sdpa when PyTorch is installed in .venv),
# prints the table and fmha against the faster peer, writes results.json and
# renders report/README.md with its charts. Extra arguments go to fmha-bench;
# with them the peers are skipped (scripts/compare.sh measures peers on any
# grid).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
grid=(--seqs 128,256,512,1024,2048 --dims 64 --dtypes float32 --variants plain --modes fwd,fwdbwd)
build/fmha-bench "${grid[@]}" --impls fmha_auto,fmha_dense,fmha_tiled,fmha_portable --out results.json "$@"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"   # the source tree's fmha package
if [ "$#" -eq 0 ]; then
    peers=jax_xla
    if .venv/bin/python -c "import torch" 2>/dev/null; then peers+=",torch_sdpa"; fi
    FMHA_LIBRARY="$PWD/build/libfmha.so" .venv/bin/python -m fmha.tools.bench_peers "${grid[@]}" \
        --impls "$peers" --out results.json --append
else
    echo "bench.sh: peers skipped (custom grid); scripts/compare.sh measures them on any grid"
fi
.venv/bin/python -m fmha.tools.report results.json -o report --print
echo "wrote results.json and report/README.md"
