# zig.cmake: a toolchain for the manylinux wheels. It compiles fmha with
# zig's C compiler (clang, with zig's own copies of glibc's version
# stubs): the libraries then need only the glibc symbol versions of
# FMHA_ZIG_TARGET's glibc, whatever glibc the build machine has. The
# project is C only (the JAX FFI handler too), so zig never builds a C++
# runtime.
# tests/install/run.sh (x86-64) and tests/install/arm64.sh (aarch64, a
# cross build) make the wheels with it; zig is the PyPI package ziglang.
#   cmake -S . -B build-zig -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/zig.cmake \
#         -DFMHA_ZIG=/path/to/zig -DFMHA_ZIG_TARGET=x86_64-linux-gnu.2.28
# FMHA_ZIG: the zig executable (default: zig on PATH; the package's is
#   python -c "import ziglang, os; print(os.path.dirname(ziglang.__file__))"/zig).
# FMHA_ZIG_TARGET: zig's target, <arch>-linux-gnu.<glibc version> (default:
#   this host's architecture and glibc 2.28, the manylinux_2_28 policy).
# The target CPU is the architecture's baseline (zig's default when a
# target is named); only the kernel files get ISA flags (CMakeLists.txt).
# zig keeps what it builds once per target (glibc stubs, compiler-rt) in its
# cache, ZIG_GLOBAL_CACHE_DIR or ~/.cache/zig.
if(NOT FMHA_ZIG)
  find_program(FMHA_ZIG zig)
endif()
if(NOT FMHA_ZIG)
  message(FATAL_ERROR "cmake/zig.cmake: no zig found; pass -DFMHA_ZIG=<path of zig> "
                      "(pip install ziglang: <site-packages>/ziglang/zig)")
endif()
if(NOT FMHA_ZIG_TARGET)
  set(FMHA_ZIG_TARGET ${CMAKE_HOST_SYSTEM_PROCESSOR}-linux-gnu.2.28)
endif()
set(FMHA_ZIG ${FMHA_ZIG} CACHE FILEPATH "zig executable")
set(FMHA_ZIG_TARGET ${FMHA_ZIG_TARGET} CACHE STRING "zig target: <arch>-linux-gnu.<glibc version>")
# the checks' test projects (try_compile) get the same compiler
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES FMHA_ZIG FMHA_ZIG_TARGET)

string(REGEX MATCH "^[^-]+" _fmha_zig_arch "${FMHA_ZIG_TARGET}")
if(NOT _fmha_zig_arch STREQUAL CMAKE_HOST_SYSTEM_PROCESSOR)
  set(CMAKE_SYSTEM_NAME Linux)
  set(CMAKE_SYSTEM_PROCESSOR ${_fmha_zig_arch})
endif()
# the compiler as zig and its mandatory arguments
set(CMAKE_C_COMPILER ${FMHA_ZIG} cc -target ${FMHA_ZIG_TARGET})
