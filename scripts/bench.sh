#!/usr/bin/env bash
# bench.sh: the main job. Builds fmha optimised, runs fmha-bench on the
# seed's first configuration (seqs 128..2048, D = 64, float32, plain, fwd and
# fwdbwd, all four strategies), prints the table, writes results.json and
# renders report/README.md with its charts. Extra arguments go to fmha-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
build/fmha-bench --seqs 128,256,512,1024,2048 --dims 64 --dtypes float32 --variants plain \
    --modes fwd,fwdbwd --impls fmha_auto,fmha_dense,fmha_tiled,fmha_portable \
    --out results.json "$@"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"   # the source tree's fmha package
.venv/bin/python -m fmha.report results.json -o report
echo "wrote results.json and report/README.md"
