#!/usr/bin/env bash
# test.sh: every test of fmha, in stages, each timed (a table of the stage
# times ends the output). Builds the library twice: with AddressSanitizer +
# UndefinedBehaviorSanitizer, and optimised (Release: what ships). Runs the
# C tests (ctest) on both, the Python tests (bindings, fmha-bench, report)
# on the optimised one, the packaging checks (tests/install/run.sh: the
# sdist and the manylinux_2_28 wheel, compiled by zig, each in a throwaway
# virtualenv, the Python tests again on the wheel's library; C consumers
# of an installed fmha through find_package and pkg-config, built and run)
# and a 60-second run of the libFuzzer target (scripts/fuzz.sh, clang).
# Every kernel table this CPU can run is tested, amx_emu included (the amx
# kernels on a software tile unit, on any AVX512_BF16 CPU). On an x86-64
# host it also cross-builds for aarch64 (cmake/aarch64-linux-gnu.cmake) and
# runs the C tests under qemu with FMHA_TEST_QUICK=1 (smaller sizes, every
# path) on each ARM table, then the aarch64 wheel's NumPy tests on an
# emulated arm64 Python (tests/install/arm64.sh).
#
# Emulated stages run one test at a time (one qemu process, whose pool has
# as many threads as the host has cores: never more runnable threads than
# cores) and each within a budget (seconds, measured on 2 cores with room
# for a slower host): a stage past its budget is stopped and fails, with
# its name, so the command finishes within 30 minutes on 2 cores. qemu 7.2
# emulates SVE at 512 bits about 40 times slower than at 128 bits, so the
# sve table's tile tests run at 128 bits and only the kernel tests at 512.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
stage_names=() stage_secs=() stage_status=()
stage_begin() { stage_name=$1; stage_t0=$SECONDS; echo "== $1 =="; }
stage_end() { # status of the stage
    stage_names+=("$stage_name") stage_secs+=($((SECONDS - stage_t0))) stage_status+=("$1")
}
# budget SECONDS command...: the command, stopped and failing past its budget
budget() {
    local secs=$1 rc=0
    shift
    timeout --signal=TERM --kill-after=10 "$secs" "$@" || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "test.sh: stage '$stage_name' overran its budget of $secs s (stopped)" >&2
    fi
    return "$rc"
}

stage_begin "setup (apt, .venv)"
scripts/setup.sh test
stage_end ok
jobs=$(nproc)

stage_begin "build (sanitized, Release)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFMHA_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$jobs"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_STATIC=ON >/dev/null
cmake --build build -j "$jobs"
stage_end ok

status=0
run_stage() { # name, command...: one stage, its status recorded
    local name=$1 rc=0
    shift
    stage_begin "$name"
    "$@" || rc=$?
    if [ "$rc" = 0 ]; then stage_end ok; else stage_end "FAILED ($rc)"; status=1; fi
}

asan_ctest() {
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir build-asan --output-on-failure -j "$jobs"
}
run_stage "C tests (ASan + UBSan)" asan_ctest
run_stage "C tests (Release library)" ctest --test-dir build --output-on-failure -j "$jobs"

if [ "$(uname -m)" = x86_64 ]; then
    arm_build() {
        cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
            -DCMAKE_BUILD_TYPE=Release -DFMHA_BUILD_BENCH=OFF >/dev/null
        cmake --build build-aarch64 -j "$jobs"
    }
    run_stage "aarch64 cross-build" arm_build
    # Each table where it differs from the others (FMHA_TEST_ISAS; scalar is
    # the x86 runs' too): neonbf16, the default of BF16 cores, over every
    # test; sve's own tile part at 512 bits (NR 64) over the kernel tests
    # and at 128 bits (NR 16) over the tests of tiles; neon alone as a
    # Neoverse N1 (no BF16, no SVE). Budgets: about twice the times on 2
    # cores of an Intel Xeon (270, 15, 180 and 25 s).
    arm_ctest() { # budget, QEMU_CPU, FMHA_TEST_ISAS, ctest's arguments...
        local secs=$1 cpu=$2 isas=$3
        shift 3
        budget "$secs" env FMHA_TEST_QUICK=1 QEMU_CPU="$cpu" FMHA_TEST_ISAS="$isas" \
            ctest --test-dir build-aarch64 --output-on-failure -j 1 "$@"
    }
    run_stage "aarch64 neonbf16, every test (qemu)" arm_ctest 600 max neonbf16
    run_stage "aarch64 sve 512 bits, kernel tests (qemu)" \
        arm_ctest 60 max,sve-default-vector-length=64 sve -R '^test_ukernels$'
    run_stage "aarch64 sve 128 bits, tile tests (qemu)" arm_ctest 400 max,sve-default-vector-length=16 sve \
        -R '^test_(ukernels|forward|backward|masks|ieee|lowp|dropout|differential|threads)$'
    run_stage "aarch64 neon as a Neoverse N1 (qemu)" \
        arm_ctest 90 neoverse-n1 neon -R '^test_(ukernels|bf16_ukernels|forward)$'
    run_stage "aarch64 wheel on an emulated arm64 Python" \
        budget 600 env -u FMHA_LIBRARY -u FMHA_BENCH -u PYTHONPATH tests/install/arm64.sh build-aarch64
fi

python_tests() {
    # pytest exits 5 when it collected no test; that is a failure here too.
    # FMHA_REQUIRE_TORCH=1: the torch tests fail, not skip, without PyTorch.
    FMHA_REQUIRE_TORCH=1 FMHA_LIBRARY="$PWD/build/libfmha.so" FMHA_BENCH="$PWD/build/fmha-bench" \
        PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest -q tests/python
}
run_stage "Python tests (Release library)" python_tests
run_stage "Packaging (sdist, manylinux wheel, find_package and pkg-config consumers)" \
    env -u FMHA_LIBRARY -u FMHA_BENCH -u PYTHONPATH tests/install/run.sh build
run_stage "fuzz_api (libFuzzer, ASan + UBSan, 60 s)" scripts/fuzz.sh 60

echo "== stage times =="
for i in "${!stage_names[@]}"; do
    printf '%6d s  %-72s %s\n' "${stage_secs[$i]}" "${stage_names[$i]}" "${stage_status[$i]}"
done
printf '%6d s  %s\n' $((SECONDS - t_start)) "in all"
exit "$status"
