#!/usr/bin/env bash
# build_wheel.sh: the manylinux_2_28 wheel of one architecture, as the
# packaging checks build it (tests/install/run.sh: x86_64, from the sdist;
# tests/install/arm64.sh: aarch64, from the repository).
#   1. pip wheel (the pyproject.toml build) with cmake/zig.cmake: zig cc
#      (the PyPI package ziglang, in the development .venv) for
#      <arch>-linux-gnu.2.28, so the libraries (the JAX FFI handler too, C
#      as the rest) ask for no glibc symbol version past 2.28 whatever the
#      build machine's glibc;
#   2. auditwheel repair, which tags the wheel with the oldest manylinux
#      policy its symbols allow; the tag must be manylinux_2_28 or older;
#   3. prints auditwheel show's verdict on the repaired wheel.
# Logs go to OUT_DIR; the last line printed is the repaired wheel's path.
# Exits non-zero, with the log of the failing step, on any failure.
#   usage: tests/install/build_wheel.sh SOURCE(sdist or directory) ARCH(x86_64|aarch64) OUT_DIR
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
source=${1:?usage: build_wheel.sh SOURCE ARCH OUT_DIR} arch=${2:?ARCH} out=${3:?OUT_DIR}
python="$repo/.venv/bin/python"
glibc=2.28   # manylinux_2_28: RHEL 8, Ubuntu 20.04, Debian 10 and newer
fail() { cat "$1" >&2; echo "build_wheel: $2" >&2; exit 1; }
mkdir -p "$out"

zig="$("$python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))' 2>/dev/null)" \
    || { echo "build_wheel: no ziglang in $repo/.venv (scripts/setup.sh test installs it)" >&2; exit 1; }
cross=()
[ "$arch" = "$(uname -m)" ] || cross=(env _PYTHON_HOST_PLATFORM="linux-$arch")   # the wheel's tag
"${cross[@]}" "$python" -m pip wheel -q --no-deps -w "$out/dist" -C build-dir="$out/build" \
    -C cmake.define.CMAKE_TOOLCHAIN_FILE="$repo/cmake/zig.cmake" -C cmake.define.FMHA_ZIG="$zig" \
    -C cmake.define.FMHA_ZIG_TARGET="$arch-linux-gnu.$glibc" "$source" >"$out/wheel.log" 2>&1 \
    || fail "$out/wheel.log" "building the $arch wheel with zig failed"
built=$(ls "$out"/dist/fmha-*-linux_"$arch".whl)

PATH="$(dirname "$python"):$PATH" "$python" -m auditwheel repair -w "$out/wheelhouse" "$built" \
    >"$out/repair.log" 2>&1 || fail "$out/repair.log" "auditwheel repair failed"
wheel=$(ls "$out"/wheelhouse/fmha-*.whl)
# the platform tags (fmha-V-py3-none-TAG.TAG...whl): each manylinux_2_N with N <= 28
tags=$(basename "$wheel" .whl | cut -d- -f5)
for tag in ${tags//./ }; do
    case "$tag" in
        manylinux_2_*_"$arch")
            minor=${tag#manylinux_2_} minor=${minor%%_*}
            [ "$minor" -le "${glibc#2.}" ] || { echo "build_wheel: $(basename "$wheel"): $tag is newer than manylinux_2_${glibc#2.}" >&2; exit 1; } ;;
        manylinux2014_"$arch") ;;   # manylinux_2_17's alias
        *) echo "build_wheel: $(basename "$wheel"): $tag is not a manylinux tag for $arch" >&2; exit 1 ;;
    esac
done
PATH="$(dirname "$python"):$PATH" "$python" -m auditwheel show "$wheel" >"$out/show.log" 2>&1 \
    || fail "$out/show.log" "auditwheel show failed"
echo "build_wheel: auditwheel show: $(tr '\n' ' ' <"$out/show.log" | grep -o 'is consistent with the following platform tag: "[^"]*"' || cat "$out/show.log")"
echo "$wheel"
