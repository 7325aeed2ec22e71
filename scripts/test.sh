#!/usr/bin/env bash
# test.sh: every test of fmha. Builds the library twice: once with
# AddressSanitizer + UndefinedBehaviorSanitizer for the C tests (ctest), once
# optimised for the Python tests (bindings, fmha-bench, report), then runs
# both suites, the packaging checks (tests/install/run.sh: the sdist and
# the manylinux wheel each in a throwaway virtualenv, C consumers of an
# installed fmha through find_package and pkg-config, built and run) and a
# 60-second run of the libFuzzer target (scripts/fuzz.sh, clang). On an
# x86-64 host it also cross-builds for aarch64 (cmake/aarch64-linux-gnu.cmake)
# and runs the C tests under qemu with FMHA_TEST_QUICK=1 (smaller sizes, every
# path) on each ARM table (neonbf16, sve at 512 and 128 bits, neon as a
# Neoverse N1), then the aarch64 wheel's NumPy tests on an emulated arm64
# Python (tests/install/arm64.sh). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
jobs=$(nproc)

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFMHA_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_STATIC=ON >/dev/null
cmake --build build -j "$jobs"

status=0
echo "== C tests (ASan + UBSan) =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" || status=1

if [ "$(uname -m)" = x86_64 ]; then
    echo "== aarch64 C tests (cross-built, under qemu-aarch64, FMHA_TEST_QUICK=1) =="
    cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
        -DCMAKE_BUILD_TYPE=Release -DFMHA_BUILD_BENCH=OFF >/dev/null
    cmake --build build-aarch64 -j "$jobs"
    # Each table where it differs from the others (FMHA_TEST_ISAS; scalar is
    # the x86 runs' too): neonbf16, the default of BF16 cores, over every
    # test; sve's own tile part at 512 bits (NR 64) over the tests of tiles
    # and at 128 bits (NR 16) over the kernel and forward tests; neon alone
    # as a Neoverse N1 (no BF16, no SVE).
    arm_ctest() { FMHA_TEST_QUICK=1 ctest --test-dir build-aarch64 --output-on-failure -j "$jobs" "$@"; }
    FMHA_TEST_ISAS=neonbf16 QEMU_CPU=max arm_ctest || status=1
    FMHA_TEST_ISAS=sve QEMU_CPU=max,sve-default-vector-length=64 \
        arm_ctest -R '^test_(ukernels|forward|backward|masks|ieee|lowp|dropout|differential|threads)$' || status=1
    FMHA_TEST_ISAS=sve QEMU_CPU=max,sve-default-vector-length=16 arm_ctest -R '^test_(ukernels|forward)$' || status=1
    FMHA_TEST_ISAS=neon QEMU_CPU=neoverse-n1 arm_ctest -R '^test_(ukernels|bf16_ukernels|forward)$' || status=1
    echo "== aarch64 wheel on an emulated arm64 Python =="
    (unset FMHA_LIBRARY FMHA_BENCH PYTHONPATH; tests/install/arm64.sh) || status=1
fi

echo "== Python tests =="
export FMHA_LIBRARY="$PWD/build/libfmha.so" FMHA_BENCH="$PWD/build/fmha-bench"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"   # the source tree's fmha package
set +e
.venv/bin/python -m pytest -q tests/python
rc=$?
set -e
# pytest exits 5 when it collected no test; that is a failure here too.
[ "$rc" = 0 ] || status=1

echo "== Packaging (sdist and manylinux wheel in fresh venvs, find_package and pkg-config consumers) =="
(unset FMHA_LIBRARY FMHA_BENCH PYTHONPATH; tests/install/run.sh build) || status=1

echo "== fuzz_api (libFuzzer, ASan + UBSan, 60 s) =="
scripts/fuzz.sh 60 || status=1
exit "$status"
