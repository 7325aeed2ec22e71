# aarch64-linux-gnu.cmake: cross-building fmha for 64-bit ARM Linux on
# another Linux host (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross
# qemu-user-static). ctest runs the test binaries under qemu's user-mode
# emulator with the target's libraries; QEMU_CPU chooses the CPU emulated
# (max: every extension qemu has; neoverse-n1: Armv8.2 without BF16/SVE).
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(FMHA_AARCH64_TRIPLE aarch64-linux-gnu)
set(FMHA_AARCH64_SYSROOT /usr/${FMHA_AARCH64_TRIPLE} CACHE PATH "Target libraries for qemu (-L)")
set(CMAKE_C_COMPILER ${FMHA_AARCH64_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${FMHA_AARCH64_TRIPLE}-g++)
find_program(FMHA_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(FMHA_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${FMHA_QEMU_AARCH64} -L ${FMHA_AARCH64_SYSROOT})
endif()
# Libraries and headers from the target's tree only; programs from the host.
set(CMAKE_FIND_ROOT_PATH /usr/${FMHA_AARCH64_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
