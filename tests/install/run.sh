#!/usr/bin/env bash
# run.sh: the packaging checks of scripts/test.sh, as a new user meets fmha.
#   1. builds the sdist (python -m build --sdist) and from it the wheel (pip
#      wheel, the pyproject.toml build), which auditwheel repair turns into a
#      manylinux wheel (the library needs only libc, libm and pthreads);
#   2. installs the manylinux wheel with numpy and jax into a throwaway
#      virtualenv, checks its library's tile configuration from the machine
#      code (tests/python/test_amx_static.py), then runs smoke.py there from
#      a directory outside the repository, with no compiler on PATH, an
#      empty cache and no FMHA_* variable;
#   3. installs the sdist with numpy into another throwaway virtualenv (a
#      build from source, without the JAX handler to keep it short) and runs
#      smoke.py there;
#   4. installs the C library of BUILD_DIR (a configured, built CMake tree)
#      into a temporary prefix, then builds and runs tests/install/consumer/
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

# ---- the sdist, and the manylinux wheel built from it ----------------------------
fail() { cat "$1"; echo "install: $2" >&2; exit 1; }
"$python" -m build --sdist -o "$tmp/dist" "$repo" >"$tmp/sdist.log" 2>&1 || fail "$tmp/sdist.log" "building the sdist failed"
sdist=$(ls "$tmp"/dist/fmha-*.tar.gz)
say "built $(basename "$sdist") ($(du -k "$sdist" | cut -f1) KiB)"
"$python" -m pip wheel -q --no-deps -w "$tmp/dist" "$sdist" >"$tmp/wheel.log" 2>&1 \
    || fail "$tmp/wheel.log" "building the wheel from the sdist failed"
built=$(ls "$tmp"/dist/fmha-*.whl)
# auditwheel picks the oldest manylinux policy the wheel's symbols allow and
# refuses a library that needs more than the policies grant.
PATH="$(dirname "$python"):$PATH" "$python" -m auditwheel repair -w "$tmp/wheelhouse" "$built" >"$tmp/repair.log" 2>&1 \
    || fail "$tmp/repair.log" "auditwheel repair failed"
wheel=$(ls "$tmp"/wheelhouse/fmha-*.whl)
case "$(basename "$wheel")" in
    *-manylinux_2_[0-9]*_"$(uname -m)".whl|*.manylinux_2_[0-9]*_"$(uname -m)".whl) ;;
    *) echo "install: $(basename "$wheel") is not a manylinux wheel" >&2; exit 1 ;;
esac
say "built $(basename "$wheel") from it ($(du -k "$wheel" | cut -f1) KiB)"

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$wheel" numpy jax >"$tmp/pip.log" 2>&1 \
    || fail "$tmp/pip.log" "installing the wheel failed"
# torch is large: when the development venv has it, the throwaway venv sees
# it through a .pth (after its own packages, so fmha comes from the wheel).
if "$python" -c "import torch" 2>/dev/null; then
    "$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
        >"$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-dev-venv.pth"
fi
say "installed into a fresh virtualenv"
# what ships: every ldtilecfg of the wheel's library reads a constant configuration
wheel_lib=$(find "$tmp/venv" -name libfmha.so | head -1)
"$python" "$repo/tests/python/test_amx_static.py" "$wheel_lib" >"$tmp/amx-static.log" 2>&1 \
    || fail "$tmp/amx-static.log" "the wheel's tile configuration check failed"
say "$(tail -1 "$tmp/amx-static.log")"

mkdir -p "$tmp/work" "$tmp/home" "$tmp/cache"
(cd "$tmp/work" && env -i HOME="$tmp/home" XDG_CACHE_HOME="$tmp/cache" LANG=C.UTF-8 \
    PATH="$tmp/venv/bin:/usr/bin/no-such" \
    "$tmp/venv/bin/python" "$repo/tests/install/smoke.py" --source-tree "$repo" --require-jax)
if [ -n "$(ls -A "$tmp/cache")" ]; then
    echo "install: the smoke test wrote to the cache (compiled something?): $(ls -A "$tmp/cache")" >&2
    exit 1
fi
say "smoke test passed (no compiler, empty cache)"

# ---- the sdist in another throwaway virtualenv (built from source) --------------
python3 -m venv "$tmp/venv-sdist"
FMHA_JAX_FFI=0 "$tmp/venv-sdist/bin/python" -m pip install -q "$sdist" numpy >"$tmp/pip-sdist.log" 2>&1 \
    || fail "$tmp/pip-sdist.log" "installing the sdist failed"
(cd "$tmp/work" && env -i HOME="$tmp/home" LANG=C.UTF-8 PATH="$tmp/venv-sdist/bin:/usr/bin/no-such" \
    "$tmp/venv-sdist/bin/python" "$repo/tests/install/smoke.py" --source-tree "$repo")
say "the sdist installed and passed the smoke test"

# ---- the C library: find_package and pkg-config consumers ---------------------
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$repo/tests/install/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/consumer.log" 2>&1 \
    || fail "$tmp/consumer.log" "find_package(fmha) consumer: configure failed"
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 \
    || fail "$tmp/consumer.log" "find_package(fmha) consumer: build failed"
"$tmp/consumer/consumer"
[ ! -x "$tmp/consumer/consumer_static" ] || "$tmp/consumer/consumer_static"
say "find_package(fmha) consumer built and ran"

pc=$(dirname "$(find "$tmp/prefix" -name fmha.pc | head -1)")
export PKG_CONFIG_PATH="$pc"
cc -std=c11 -o "$tmp/pc-consumer" "$repo/tests/install/consumer/main.c" $(pkg-config --cflags --libs fmha) -lm \
    -Wl,-rpath,"$(pkg-config --variable=libdir fmha)"
"$tmp/pc-consumer"
say "pkg-config fmha $(pkg-config --modversion fmha) consumer built and ran"
