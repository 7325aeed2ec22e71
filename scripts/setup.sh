#!/usr/bin/env bash
# setup.sh: installs what building fmha and the given purpose need on a
# fresh Debian machine, saying what it installs, and the Python packages of
# that purpose's requirement set (python/requirements-<set>.txt) into ./.venv.
#   test   every test: also Open MPI (the ring tests), clang and libFuzzer
#          (fuzzing), pkg-config (the installed package's checks), on
#          x86-64 the aarch64 cross compiler and qemu-user-static (the
#          emulated aarch64 tests), and in .venv PyTorch (PyPI's CUDA
#          build, a large download) and transformers (the torch tests)
#   main   the main job (bench.sh): compiler, CMake, Ninja, Python; NumPy,
#          JAX, matplotlib
#   bench  compare.sh: main's set plus PyTorch (a large download)
# A second argument does one part alone: system (the Debian packages) or
# python (.venv; scripts/test.sh installs it while the libraries build).
#   usage: scripts/setup.sh [test|main|bench] [system|python]
set -euo pipefail
cd "$(dirname "$0")/.."
purpose=${1:-test} part=${2:-all}
case "$part" in all|system|python) ;; *) echo "setup: unknown part '$part' (system or python)" >&2; exit 2 ;; esac

system_packages() {
    need=()
    command -v cc >/dev/null || need+=(gcc libc6-dev)
    command -v cmake >/dev/null || need+=(cmake)
    command -v ninja >/dev/null || need+=(ninja-build)
    command -v git >/dev/null || need+=(git)
    command -v python3 >/dev/null || need+=(python3 python3-venv python3-pip)
    if [ "$purpose" = test ]; then
        command -v pkg-config >/dev/null || need+=(pkg-config)   # the test of fmha.pc
        # ring attention (libfmha_mpi and its tests under mpirun)
        command -v mpicc >/dev/null || need+=(libopenmpi-dev openmpi-bin)
        # the fuzz target (scripts/fuzz.sh): clang and its libFuzzer/sanitizer runtimes
        command -v clang >/dev/null || need+=(clang)
        if ! compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a" >/dev/null; then
            need+=(libclang-rt-dev)
        fi
        # the aarch64 stage on x86-64 hosts: a cross compiler and qemu's user-mode emulator
        if [ "$(uname -m)" = x86_64 ]; then
            command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
            command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
            command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
        fi
    fi
    if ((${#need[@]})); then
        echo "setup: installing ${need[*]}" >&2
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
    fi
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    fi
}

# PyTorch from PyPI is its CUDA build: torch asks for triton and every CUDA
# library (about 5 GB installed). A CPU needs neither triton nor the CUDA
# libraries that are never called, only those libtorch_cuda.so links: torch
# goes in without its dependencies, then its pure-Python ones and the CUDA
# libraries the machine lacks (cuFile, cuSPARSELt, NVSHMEM, NCCL). Where the
# machine has no CUDA runtime of its own, `import torch` fails and the rest of
# torch's CUDA set follows. Either way about 2-3 GB less.
pip_logged() {
    log=$(mktemp)
    .venv/bin/python -m pip install -q --no-cache-dir "$@" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
    rm -f "$log"
}

torch_packages() {
    py=.venv/bin/python
    $py -m pip install -q --no-cache-dir --no-deps torch
    # torch's own requirements whose markers hold here, triton left out
    mapfile -t reqs < <($py - <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("torch") or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name not in ("triton", "cuda-bindings"):
        print(req)
PY
)
    light=() rest=()
    for r in "${reqs[@]}"; do
        case "$r" in
            cuda-toolkit*) light+=("cuda-toolkit[cufile]${r#*]}"); rest+=("$r") ;;
            nvidia-cudnn*) rest+=("$r") ;;
            *) light+=("$r") ;;
        esac
    done
    # pip warns that torch's requirements are not all met: that is the point
    ((${#light[@]} == 0)) || pip_logged "${light[@]}"
    if ! $py -c 'import torch' 2>/dev/null; then
        echo "setup: torch does not load with this machine's CUDA libraries; installing PyPI's: ${rest[*]}" >&2
        ((${#rest[@]} == 0)) || pip_logged "${rest[@]}"
    fi
    $py -c 'import torch' || { echo "setup: torch does not load" >&2; return 1; }
}

python_packages() {
    [ -x .venv/bin/python ] || python3 -m venv .venv
    req="python/requirements-$purpose.txt"
    stamp=".venv/.installed-$(basename "$req")"
    if [ ! -f "$stamp" ] || [ "$req" -nt "$stamp" ]; then
        echo "setup: installing the Python packages of $req into .venv:" \
             "$(grep -v '^[#-]' "$req" | tr '\n' ' ')" >&2
        .venv/bin/python -m pip install -q --no-cache-dir --upgrade pip packaging >/dev/null
        # every line but torch through pip's resolver (-r lines resolved here)
        flat=$(mktemp)
        (cd python && grep -h -v '^#' "$(basename "$req")" \
            $(sed -n 's/^-r //p' "$(basename "$req")") | grep -v '^-r' | grep -v '^torch$') >"$flat"
        .venv/bin/python -m pip install -q --no-cache-dir -r "$flat"
        rm -f "$flat"
        if grep -qx torch "$req"; then torch_packages; fi
        touch "$stamp"
    fi
}

[ "$part" = python ] || system_packages
[ "$part" = system ] || python_packages
