#!/usr/bin/env bash
# compare.sh: fmha beside its peers (the `make compare` of this project).
# Sets up the bench environment (the main job's packages plus PyTorch and OpenVINO), builds fmha
# optimised, runs fmha-bench on the grid into results.json, appends the
# peers' rows to the same file (python -m fmha.tools.bench_peers: jax_xla,
# torch_sdpa, openvino_sdpa and fmha's own JAX and PyTorch bindings) and
# renders report/.
#   usage: scripts/compare.sh [--seqs ..] [--dims ..] [--dtypes ..] [--variants ..]
#                             [--modes ..] [--batch N] [--heads N] [--threads N] [--no-ref]
# Those flags go to both tools (later ones win). The impl lists come from
# FMHA_IMPLS (default fmha_auto,fmha_tiled,fmha_dense) and PEER_IMPLS
# (default jax_xla,torch_sdpa,openvino_sdpa,fmha_jax,fmha_torch).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh bench
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"   # the source tree's fmha package

grid=(--seqs 128,256,512,1024,2048 --dims 64 --dtypes float32 --variants plain,causal,masked_bias
      --modes fwd,fwdbwd --batch 1 --heads 8 --threads "$(nproc)")
build/fmha-bench "${grid[@]}" "$@" --impls "${FMHA_IMPLS:-fmha_auto,fmha_tiled,fmha_dense}" --out results.json
FMHA_LIBRARY="$PWD/build/libfmha.so" .venv/bin/python -m fmha.tools.bench_peers "${grid[@]}" "$@" \
    --impls "${PEER_IMPLS:-jax_xla,torch_sdpa,openvino_sdpa,fmha_jax,fmha_torch}" --out results.json --append
.venv/bin/python -m fmha.tools.report results.json -o report
echo "wrote results.json and report/README.md"
