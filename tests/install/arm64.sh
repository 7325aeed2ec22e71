#!/usr/bin/env bash
# arm64.sh: the aarch64 package as an ARM user meets it, on an x86-64 host
# under qemu's user-mode emulator (scripts/test.sh runs it there):
#   1. cross-builds the wheel (tests/install/build_wheel.sh: pip wheel of
#      the repository compiled by zig for aarch64 and glibc 2.28; the JAX
#      FFI handler is compiled against the host jaxlib's XLA FFI headers,
#      which are the same on every platform) and repairs it into a
#      manylinux_2_28 (or older) aarch64 wheel;
#   2. unpacks Debian's arm64 Python 3.11 and the libraries it loads into a
#      folder of its own (apt with its own lists, cache and status: nothing
#      on the system changes);
#   3. installs the wheel, NumPy, ml_dtypes and pytest built for that Python
#      into another folder (pip --target --platform, as pip on a glibc 2.28
#      system would choose them);
#   4. from a directory outside the repository, with no FMHA_* variable and
#      no compiler on PATH, checks that the wheel's library runs every
#      FMHA_ISA table that BUILD_DIR's (the CMake cross build's, GCC) runs
#      (isa_names.py), runs tests/install/smoke.py and the NumPy binding's
#      own tests as a CPU with every extension (QEMU_CPU=max: the neonbf16
#      table), then the smoke test on the sve table at 128 bits and as a
#      Neoverse N1 (the neondot table).
# The emulated Python runs through a script that names itself as argv[0],
# so that sys.executable and the tests' subprocesses run emulated too.
# One line per step; exits non-zero on the first failure.
#   usage: tests/install/arm64.sh BUILD_DIR(the aarch64 CMake build: cmake/aarch64-linux-gnu.cmake)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:?usage: arm64.sh BUILD_DIR}" && pwd)"
python="$repo/.venv/bin/python"
qemu="$(command -v qemu-aarch64-static)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/fmha-arm64.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
t0=$SECONDS
say() { echo "arm64: $* ($((SECONDS - t0)) s)"; }
fail() { cat "$1"; echo "arm64: $2" >&2; exit 1; }

# ---- 1. the wheel ------------------------------------------------------------------
"$repo/tests/install/build_wheel.sh" "$repo" aarch64 "$tmp/wheel" >"$tmp/build-wheel.out"
wheel=$(tail -1 "$tmp/build-wheel.out")
# ELF e_machine (bytes 18-19, little-endian) 183 is AArch64
"$python" - "$wheel" <<'EOF' || exit 1
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for so in ("fmha/libfmha.so", "fmha/_ffi/fmha_jax_ffi.so"):
    if so not in names:
        sys.exit(f"arm64: the wheel lacks {so}")
    head = zipfile.ZipFile(sys.argv[1]).read(so)[:20]
    if head[:4] != b"\x7fELF" or int.from_bytes(head[18:20], "little") != 183:
        sys.exit(f"arm64: {so} is not an aarch64 object")
EOF
say "built $(basename "$wheel") with zig ($(du -k "$wheel" | cut -f1) KiB; libfmha.so and the JAX FFI handler for aarch64)"
say "$(grep '^build_wheel: auditwheel show' "$tmp/build-wheel.out")"

# ---- 2. Debian's arm64 Python in a folder ------------------------------------------
# python3.11 and what it and its standard modules load
"$repo/tests/install/debian_root.sh" arm64 bookworm "$tmp/debian" python3.11-minimal libpython3.11-minimal \
    libpython3.11-stdlib libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 \
    libuuid1 libcrypt1 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libtirpc3 libnsl2 libdb5.3 \
    libgssapi-krb5-2 libkrb5-3 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1
root="$tmp/debian/root"
arm_python="$tmp/python3"
cat >"$arm_python" <<EOF
#!/bin/sh
exec "$qemu" -L "$root" -0 "\$0" "$root/usr/bin/python3.11" "\$@"
EOF
chmod +x "$arm_python"
say "Debian's arm64 $(QEMU_CPU=max "$arm_python" -c 'import platform; print("Python", platform.python_version(), "on", platform.machine())')"

# ---- 3. the packages for it ---------------------------------------------------------
# the platforms pip grants on glibc 2.28 (--platform takes each exactly)
glibc_228=(--platform manylinux2014_aarch64)
for minor in $(seq 17 28); do glibc_228+=(--platform "manylinux_2_${minor}_aarch64"); done
"$python" -m pip install -q --target "$tmp/site" --only-binary=:all: --python-version 3.11 --implementation cp \
    --abi cp311 --abi abi3 --abi none "${glibc_228[@]}" \
    "$wheel" numpy ml_dtypes pytest >"$tmp/pip.log" 2>&1 || fail "$tmp/pip.log" "installing for arm64 failed"
say "installed the wheel, numpy, ml_dtypes and pytest for it"

# ---- 4. the tests, emulated ---------------------------------------------------------
mkdir -p "$tmp/work" "$tmp/home"
run() { # QEMU_CPU, then the command's arguments
    local cpu=$1
    shift
    (cd "$tmp/work" && env -i HOME="$tmp/home" LANG=C.UTF-8 PATH=/usr/bin/no-such PYTHONPATH="$tmp/site" \
        QEMU_CPU="$cpu" ${FORCE_ISA:+FMHA_ISA=$FORCE_ISA} "$arm_python" "$@")
}
wheel_lib="$tmp/site/fmha/libfmha.so"
run max "$repo/tests/install/isa_names.py" "$repo/include/fmha.h" "$build/libfmha.so" "$wheel_lib" \
    >"$tmp/isa.log" 2>&1 || fail "$tmp/isa.log" "the wheel's library and $build/libfmha.so differ in the FMHA_ISA tables they run"
say "$(tail -1 "$tmp/isa.log")"
run max "$repo/tests/install/smoke.py" --source-tree "$repo"
# the binding's own tests (its structures and calls on this ABI); the rest
# of the NumPy tests call the same entry points, which the C tests run on
# each ARM table
numpy_tests=("$repo"/tests/python/{test_numpy_api,test_kv_formats,test_argument_rules}.py)
run max -m pytest -q -p no:cacheprovider "${numpy_tests[@]}"
say "the NumPy tests passed (QEMU_CPU=max: neonbf16)"
# the binding's tests once; the smoke test on each other table (sve at 128
# bits: qemu runs SVE at 512 bits about 40 times slower, and the C tests
# run its 512-bit tiles)
for vl in 16; do
    FORCE_ISA=sve run max,sve-default-vector-length=$vl "$repo/tests/install/smoke.py" --source-tree "$repo" \
        >"$tmp/smoke-sve.log" 2>&1 || fail "$tmp/smoke-sve.log" "the smoke test failed with FMHA_ISA=sve at $((vl * 8)) bits"
    grep -q "ISA sve$" "$tmp/smoke-sve.log" || fail "$tmp/smoke-sve.log" "FMHA_ISA=sve at $((vl * 8)) bits ran another table"
done
run neoverse-n1 "$repo/tests/install/smoke.py" --source-tree "$repo" >"$tmp/smoke-n1.log" 2>&1 \
    || fail "$tmp/smoke-n1.log" "the smoke test failed as a Neoverse N1"
# a Neoverse N1 has the dot product (Armv8.2 DotProd) and no BF16 or SVE
grep -q "ISA neondot$" "$tmp/smoke-n1.log" || fail "$tmp/smoke-n1.log" "as a Neoverse N1 another table than neondot ran"
say "the smoke test passed on the sve table at 128 bits and as a Neoverse N1 (neondot)"
