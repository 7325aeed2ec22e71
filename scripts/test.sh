#!/usr/bin/env bash
# test.sh: every test of fmha, in stages, each timed (a table of the stage
# times ends the output). Builds the library twice: with AddressSanitizer +
# UndefinedBehaviorSanitizer, and optimised (Release: what ships). Runs the
# C tests (ctest) on both, the Python tests (bindings, PyTorch's included,
# fmha-bench, report) on the optimised one, the packaging checks
# (tests/install/run.sh: the sdist and the manylinux_2_28 wheel, compiled by
# zig, each in a throwaway virtualenv, the Python tests again on the wheel's
# library; C consumers of an installed fmha through find_package and
# pkg-config, built and run) and a 60-second run of the libFuzzer target
# (scripts/fuzz.sh, clang). Every kernel table this CPU can run is tested,
# amx_emu included (the amx kernels on a software tile unit, on any
# AVX512_BF16 CPU). On an x86-64 host it also cross-builds for aarch64
# (cmake/aarch64-linux-gnu.cmake) and runs the C tests of the kernels under
# qemu on each ARM table, then the aarch64 wheel's NumPy tests on an
# emulated arm64 Python (tests/install/arm64.sh).
#
# What each run covers (FMHA_TEST_QUICK=1 shrinks sizes, counts and
# repeats, keeping every kind of case, every code path and every tolerance):
#   Release     every C test at full size on every table of this CPU;
#   ASan+UBSan  every C test on every table, quick: memory errors and
#               undefined behaviour on every path (the full sizes repeat
#               those paths, and the Release run has them);
#   qemu        FMHA_TEST_QUICK=2: quick, on the strategies that run the
#               table's own kernels (auto and tiled), the tests that run
#               kernel tables (their own FMHA_TEST_ISAS loops, or the
#               default table), each ARM table where it differs from the
#               others; the tests of generic code that the x86 runs cover
#               are left out (listed at the stage), and so is the check
#               that a plan gives a one-shot call's bits (the same planner
#               and run function: generic code).
# Stages that wait on the network or the disk, or leave a core idle, run in
# the background beside CPU-bound ones: the .venv's packages (PyTorch's
# gigabytes) beside the builds and the C tests; the fuzzer (its build, then
# one thread) beside the emulated tests; two lanes of emulated stages (each
# one qemu process): neonbf16's tests, and sve's, neon's and the aarch64
# wheel's one after another; the packaging checks from the Release tests
# on, beside all of those and the Python tests.
# Each logs to a file, printed whole when it ends, and has its own line in
# the table.
#
# Emulated stages run one test at a time (one qemu process, whose pool has
# as many threads as the host has cores) and each within a budget (seconds,
# about twice its time on 2 cores of an Intel Xeon; FMHA_TEST_BUDGET_SCALE
# multiplies them on a slower or shared host): a stage past its budget is
# stopped and fails, with its name, so the command ends in bounded time
# (the aim: within 20 minutes on 2 cores). qemu 7.2 emulates SVE at 512 bits about 40 times
# slower than at 128 bits, so the sve table's tile tests run at 128 bits
# and only the kernel tests at 512.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$SECONDS
logs=$(mktemp -d "${TMPDIR:-/tmp}/fmha-test.XXXXXX")
declare -A bg_pid bg_name
cleanup() { # background stages still running (the script stopped early), then the logs
    local pid
    for pid in "${bg_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT
stage_names=() stage_secs=() stage_status=()
status=0
stage_record() { # name, seconds, exit status
    stage_names+=("$1") stage_secs+=("$2")
    if [ "$3" = 0 ]; then stage_status+=(ok); else stage_status+=("FAILED ($3)"); status=1; fi
}
# budget SECONDS command...: the command, stopped and failing past its budget
budget() {
    local secs=$(($1 * ${FMHA_TEST_BUDGET_SCALE:-1})) rc=0
    shift
    timeout --signal=TERM --kill-after=10 "$secs" "$@" || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "test.sh: stage '$stage_name' overran its budget of $secs s (stopped)" >&2
    fi
    return "$rc"
}
run_stage() { # name, command...: one stage in the foreground, its status recorded
    local rc=0 t0=$SECONDS
    stage_name=$1
    shift
    echo "== $stage_name =="
    "$@" || rc=$?
    stage_record "$stage_name" $((SECONDS - t0)) "$rc"
    return 0
}
# bg_run KEY command...: (inside a background job) the command with its
# output in KEY's log, then its status and seconds in KEY's status file;
# bg_record KEY: prints KEY's log and records the stage.
bg_run() {
    local key=$1 rc=0 t0=$SECONDS
    shift
    stage_name=${bg_name[$key]}
    "$@" >"$logs/$key.log" 2>&1 </dev/null || rc=$?
    echo "$rc $((SECONDS - t0))" >"$logs/$key.status"
}
bg_record() {
    local key=$1 rc=1 secs=0
    [ ! -f "$logs/$key.status" ] || read -r rc secs <"$logs/$key.status"
    echo "== ${bg_name[$key]} (ended in the background) =="
    cat "$logs/$key.log" 2>/dev/null || true
    stage_record "${bg_name[$key]}" "$secs" "$rc"
    return "$rc"
}
# bg_stage KEY NAME command...: one stage in the background (its own process
# group), its output in a log; bg_wait KEY prints the log and records it.
bg_stage() {
    local key=$1
    bg_name[$key]=$2
    shift 2
    echo "== ${bg_name[$key]} (in the background; its output when it ends) =="
    set -m
    bg_run "$key" "$@" &
    set +m
    bg_pid[$key]=$!
}
bg_wait() { # KEY; returns the stage's exit status
    local key=$1
    wait "${bg_pid[$key]}" || true
    unset "bg_pid[$key]"
    bg_record "$key"
}
# bg_lane LANE KEY NAME [KEY NAME]...: stages run one after another in the
# background (one process group), each the shell function KEY, its output
# in its own log; bg_wait_lane LANE prints and records each, in order.
declare -A lane_keys
bg_lane() {
    local lane=$1 key
    shift
    lane_keys[$lane]=""
    while [ $# -gt 0 ]; do
        bg_name[$1]=$2 lane_keys[$lane]+="$1 "
        echo "== $2 (in the background, after the stages before it on its lane) =="
        shift 2
    done
    set -m
    (for key in ${lane_keys[$lane]}; do bg_run "$key" "$key"; done) &
    set +m
    bg_pid[$lane]=$!
}
bg_wait_lane() { # LANE
    local lane=$1 key
    wait "${bg_pid[$lane]}" || true
    unset "bg_pid[$lane]"
    for key in ${lane_keys[$lane]}; do bg_record "$key" || true; done
}
# From a background stage: waits until the .venv stage has ended; its status.
wait_for_venv() {
    local rc secs
    while [ ! -f "$logs/venv.status" ]; do sleep 2; done
    read -r rc secs <"$logs/venv.status"
    [ "$rc" = 0 ] || echo "test.sh: the .venv stage failed (see its log)" >&2
    return "$rc"
}
# The failed tests of each ctest run and their lines that say why (the
# seed, FAIL lines, sanitizer reports), printed last: a long log's tail
# then still names them.
print_failures() {
    local dir f
    for dir in build-asan build build-aarch64; do
        f=$dir/Testing/Temporary/LastTestsFailed.log
        [ -s "$f" ] && [ "$f" -nt "$logs" ] || continue # this run's
        echo "== failed tests ($dir) =="
        cat "$f"
        awk '/ Testing: /{n = 0; name = $NF}
             /seed: |FAIL|ERROR: |runtime error|SUMMARY: |passed, [1-9]/{keep[n++] = name ": " $0}
             /^Test Failed/{for (i = 0; i < n && i < 20; i++) print keep[i]}' \
            "$dir/Testing/Temporary/LastTest.log" || true
    done
}
print_times() {
    print_failures
    echo "== stage times =="
    for i in "${!stage_names[@]}"; do
        printf '%6d s  %-72s %s\n' "${stage_secs[$i]}" "${stage_names[$i]}" "${stage_status[$i]}"
    done
    printf '%6d s  %s\n' $((SECONDS - t_start)) "in all"
}

run_stage "setup: system packages" scripts/setup.sh test system
[ "$status" = 0 ] || { print_times; exit 1; }
jobs=$(nproc)
# the Python packages (PyTorch's CUDA build is most of it: a download and
# gigabytes written) while the libraries build; the stages from the aarch64
# wheel on need them
bg_stage venv "setup: .venv (Python packages)" scripts/setup.sh test python

# the sanitized build with line tables only (-g1: the reports' file:line,
# a fifth less compile time than -g), without the measuring tools
builds() {
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFMHA_SANITIZE=ON \
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DFMHA_BUILD_BENCH=OFF >/dev/null &&
        cmake --build build-asan -j "$jobs" &&
        cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFMHA_STATIC=ON >/dev/null &&
        cmake --build build -j "$jobs"
}
run_stage "build (sanitized, Release)" builds

# every test and table at the quick sizes (see above); the Release run has
# the full ones. test_tuning_invalid is test_tuning again with a text the
# library ignores (the same paths): the Release run checks that it does;
# the prefetch reruns are test_kvformat's and test_paged's kernels and
# drivers again with a prefetch hint (no load): the Release run has them.
asan_ctest() {
    FMHA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --test-dir build-asan --output-on-failure -j "$jobs" \
        -E '^test_(tuning_invalid|kvformat_prefetch|paged_prefetch)$'
}
run_stage "C tests (ASan + UBSan, quick sizes)" asan_ctest
run_stage "C tests (Release library)" ctest --test-dir build --output-on-failure -j "$jobs"
# the packaging checks (mostly one thread: pip, zig, the wheel's tests, the
# consumers) from here on beside the CPU-bound stages; they need the .venv
packaging() {
    wait_for_venv && env -u FMHA_LIBRARY -u FMHA_BENCH -u PYTHONPATH tests/install/run.sh build
}
bg_lane pkg packaging "Packaging (sdist, manylinux wheel, find_package and pkg-config consumers)"

if [ "$(uname -m)" = x86_64 ]; then
    arm_build() {
        cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
            -DCMAKE_BUILD_TYPE=Release -DFMHA_BUILD_BENCH=OFF >/dev/null &&
            cmake --build build-aarch64 -j "$jobs"
    }
    run_stage "aarch64 cross-build" arm_build
    # the fuzzer: its build (clang) overlaps the venv's end; its run is one
    # thread beside the emulated tests
    bg_stage fuzz "fuzz_api (libFuzzer, ASan + UBSan, 60 s)" scripts/fuzz.sh 60
    # Each table where it differs from the others (FMHA_TEST_ISAS; scalar is
    # the x86 runs' too): neonbf16, the default of BF16 cores, over the tests
    # that run tables; sve's own tile part at 512 bits (NR 64) over the
    # kernel tests and at 128 bits (NR 16) over the tests of tiles; neon
    # alone as a Neoverse N1 (no BF16, no SVE).
    # FMHA_SPIN_US=0: the pool's workers sleep at once (a spin under qemu is
    # an emulated loop of clock reads; the x86 runs test the spin).
    arm_ctest() { # budget, QEMU_CPU, FMHA_TEST_ISAS, ctest's arguments...
        local secs=$1 cpu=$2 isas=$3
        shift 3
        budget "$secs" env FMHA_TEST_QUICK=2 FMHA_SPIN_US=0 QEMU_CPU="$cpu" FMHA_TEST_ISAS="$isas" \
            ctest --test-dir build-aarch64 --output-on-failure -j 1 "$@"
    }
    # Left out there: the tests of generic code that the x86 runs cover
    # (fork, the pool's sleep-only path, the stress of concurrent callers,
    # the reference's gradient checks, dropout's scalar kernel, the wisdom
    # files and the planner that measures), the FMHA_TUNING schedules of
    # x86 tables (tile variants, the AMX driver's), the invalid-text parser
    # check, the decode prefetch reruns (the same kernels, a prefetch hint)
    # and the record of x86-64's output bits (test_bits).
    arm_generic='^test_(fork|pool_nospin|stress|ref_gradcheck|ref_masks_gradcheck|dropout|wisdom|tuning_(tall|large|invalid|matrix)|paged_prefetch|kvformat_prefetch|bits)$'
    # Two lanes of emulated stages side by side (a qemu process keeps about
    # 1.35 of the 2 cores busy, so each leaves room for the other): neonbf16
    # in the foreground; in the background sve's tile part, its kernels at
    # 512 bits, neon as a Neoverse N1, then the aarch64 wheel (which needs
    # the .venv). sve's tile part: the tests that drive its float32 tiles
    # forward and back (the masks', the low precisions' and the thread
    # counts' paths are the drivers' and the bf16 kernels', which
    # neonbf16's stage runs).
    sve128() {
        arm_ctest 600 max,sve-default-vector-length=16 sve -R '^test_(ukernels|forward|backward|ieee)$'
    }
    sve512() { arm_ctest 120 max,sve-default-vector-length=64 sve -R '^test_ukernels$'; }
    n1() { arm_ctest 150 neoverse-n1 neon -R '^test_(ukernels|bf16_ukernels|forward)$'; }
    arm64_wheel() {
        wait_for_venv &&
            budget 600 env -u FMHA_LIBRARY -u FMHA_BENCH -u PYTHONPATH tests/install/arm64.sh build-aarch64
    }
    bg_lane arm \
        sve128 "aarch64 sve 128 bits, tile tests (qemu)" \
        sve512 "aarch64 sve 512 bits, kernel tests (qemu)" \
        n1 "aarch64 neon as a Neoverse N1 (qemu)" \
        arm64_wheel "aarch64 wheel on an emulated arm64 Python"
    run_stage "aarch64 neonbf16, the tests of tables (qemu)" arm_ctest 900 max neonbf16 -E "$arm_generic"
fi
if ! bg_wait venv; then
    [ "$(uname -m)" != x86_64 ] || bg_wait_lane arm
    bg_wait_lane pkg
    print_times
    exit 1
fi

python_tests() {
    # pytest exits 5 when it collected no test; that is a failure here too.
    # FMHA_REQUIRE_TORCH=1: the torch tests fail, not skip, without PyTorch.
    # Two workers (pytest-xdist), a file's tests on one (module fixtures
    # such as test_torch_ring's process groups run once).
    FMHA_REQUIRE_TORCH=1 FMHA_LIBRARY="$PWD/build/libfmha.so" FMHA_BENCH="$PWD/build/fmha-bench" \
        PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest -q -n 2 --dist loadfile \
        tests/python
}
run_stage "Python tests (Release library)" python_tests
bg_wait_lane pkg
if [ "$(uname -m)" = x86_64 ]; then
    bg_wait_lane arm
    bg_wait fuzz || true
else
    run_stage "fuzz_api (libFuzzer, ASan + UBSan, 60 s)" scripts/fuzz.sh 60
fi

print_times
exit "$status"
