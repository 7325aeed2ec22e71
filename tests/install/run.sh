#!/usr/bin/env bash
# run.sh: the packaging checks of scripts/test.sh, as a new user meets fmha.
#   1. builds the wheel (pip wheel ., the pyproject.toml build) and installs
#      it with numpy and jax into a throwaway virtualenv, then runs smoke.py
#      there from a directory outside the repository, with no compiler on
#      PATH, an empty cache and no FMHA_* variable;
#   2. installs the C library of BUILD_DIR (a configured, built CMake tree)
#      into a temporary prefix and builds and runs tests/install/consumer/
#      with find_package(fmha) and main.c with pkg-config --cflags --libs fmha.
# One line per step; exits non-zero on the first failure.
#   usage: tests/install/run.sh BUILD_DIR
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:?usage: run.sh BUILD_DIR}" && pwd)"
python="$repo/.venv/bin/python"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/fmha-install.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
say() { echo "install: $* ($((SECONDS - t0)) s)"; }

# ---- the wheel in a throwaway virtualenv ------------------------------------
"$python" -m pip wheel -q --no-deps -w "$tmp/dist" "$repo" >"$tmp/wheel.log" 2>&1 \
    || { cat "$tmp/wheel.log"; echo "install: building the wheel failed" >&2; exit 1; }
wheel=$(ls "$tmp"/dist/fmha-*.whl)
say "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$wheel" numpy jax >"$tmp/pip.log" 2>&1 \
    || { cat "$tmp/pip.log"; echo "install: installing the wheel failed" >&2; exit 1; }
# torch is large: when the development venv has it, the throwaway venv sees
# it through a .pth (after its own packages, so fmha comes from the wheel).
if "$python" -c "import torch" 2>/dev/null; then
    "$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
        >"$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-dev-venv.pth"
fi
say "installed into a fresh virtualenv"

mkdir -p "$tmp/work" "$tmp/home" "$tmp/cache"
(cd "$tmp/work" && env -i HOME="$tmp/home" XDG_CACHE_HOME="$tmp/cache" LANG=C.UTF-8 \
    PATH="$tmp/venv/bin:/usr/bin/no-such" \
    "$tmp/venv/bin/python" "$repo/tests/install/smoke.py" --source-tree "$repo" --require-jax)
if [ -n "$(ls -A "$tmp/cache")" ]; then
    echo "install: the smoke test wrote to the cache (compiled something?): $(ls -A "$tmp/cache")" >&2
    exit 1
fi
say "smoke test passed (no compiler, empty cache)"

# ---- the C library: find_package and pkg-config consumers ---------------------
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$repo/tests/install/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/consumer.log" 2>&1 \
    || { cat "$tmp/consumer.log"; echo "install: find_package(fmha) consumer: configure failed" >&2; exit 1; }
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 \
    || { cat "$tmp/consumer.log"; echo "install: find_package(fmha) consumer: build failed" >&2; exit 1; }
"$tmp/consumer/consumer"
[ ! -x "$tmp/consumer/consumer_static" ] || "$tmp/consumer/consumer_static"
say "find_package(fmha) consumer built and ran"

pc=$(dirname "$(find "$tmp/prefix" -name fmha.pc | head -1)")
export PKG_CONFIG_PATH="$pc"
cc -std=c11 -o "$tmp/pc-consumer" "$repo/tests/install/consumer/main.c" $(pkg-config --cflags --libs fmha) -lm \
    -Wl,-rpath,"$(pkg-config --variable=libdir fmha)"
"$tmp/pc-consumer"
say "pkg-config fmha $(pkg-config --modversion fmha) consumer built and ran"
