#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer target tests/fuzz/fuzz_api.c with clang
# (AddressSanitizer + UndefinedBehaviorSanitizer; the ISA kernel directories
# without UBSan, see CMakeLists.txt) into build-fuzz/ and runs
# it for the given seconds (default 60) from the seeds in tests/fuzz/corpus/.
# Inputs that reach new code are kept in build-fuzz/corpus/; a failing input
# is saved in build-fuzz/crashes/ and the script exits non-zero. Replay one
# with: build-fuzz/fuzz_api build-fuzz/crashes/<file>
#   usage: scripts/fuzz.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cc=${FMHA_FUZZ_CC:-clang}

if ! command -v "$cc" >/dev/null; then
    echo "fuzz.sh: $cc not found. The fuzz target needs clang with its libFuzzer runtime:" \
         "apt-get install clang libclang-rt-dev (scripts/setup.sh installs them)." >&2
    exit 1
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$probe/probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/probe.c" -o "$probe/probe" 2>"$probe/err"; then
    echo "fuzz.sh: $cc cannot link a libFuzzer target; install its runtime" \
         "(Debian: libclang-rt-<version>-dev, or libclang-common-<version>-dev on older releases):" >&2
    cat "$probe/err" >&2
    exit 1
fi

# line tables only (-g1): the reports' file:line, a fifth less compile time
CC="$cc" cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFMHA_FUZZ=ON \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DFMHA_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz --target fuzz_api -j "$(nproc)"

mkdir -p build-fuzz/corpus build-fuzz/crashes
echo "== fuzz_api for ${seconds} s =="
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    build-fuzz/fuzz_api -max_total_time="$seconds" -max_len=512 -timeout=60 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/ build-fuzz/corpus tests/fuzz/corpus
