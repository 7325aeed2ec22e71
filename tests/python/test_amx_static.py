"""test_amx_static: the tile configuration of the shipped library, checked
from its machine code, so no AMX CPU is needed (an emulator runs the C
source's semantics and cannot see what the optimiser dropped).

Every `ldtilecfg` in libfmha.so must read a constant: a RIP-relative operand
in a read-only section, whose 64 bytes are a palette-1 configuration giving
tmm0..tmm7 the 16 rows x 64 bytes the kernels load. A configuration built
at run time is what GCC 12's _tile_loadconfig let -O2 reduce to its palette
byte (every tile instruction then faulted); this check fails on such code.

Runs on the library under test (FMHA_LIBRARY: the Release build in the test
command; the packaging stage runs it on the wheel's copy too). Also a
script: python tests/python/test_amx_static.py path/to/libfmha.so
"""

import os
import platform
import re
import shutil
import struct
import subprocess
import sys

import pytest

SHF_WRITE = 0x1
LINE = re.compile(r"^\s*([0-9a-f]+):\s+(ldtilecfg|tileloadd|tdpbf16ps)\b\s*(\S*)(?:\s+#\s+([0-9a-f]+))?")


def sections(path):
    """(name, address, file offset, size, flags) of each section of an ELF64 file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path} is not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]
    out = []
    for name, _type, flags, addr, offset, size in heads:
        end = data.index(b"\0", names_off + name)
        out.append((data[names_off + name:end].decode(), addr, offset, size, flags))
    return data, out


def tile_config_problems(path):
    """The ldtilecfg sites and a list of what is wrong with them (empty: all
    good). Raises pytest.skip when the library holds no tile code."""
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) is not installed")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], check=True, capture_output=True,
                         text=True).stdout
    sites, tile_code = [], False
    for line in asm.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tile_code = True
        if m.group(2) == "ldtilecfg":
            sites.append((int(m.group(1), 16), m.group(3), m.group(4) and int(m.group(4), 16)))
    if not tile_code:
        pytest.skip(f"{path} holds no tile instructions (built without the amx table)")
    problems = []
    if not sites:
        problems.append("tile instructions but no ldtilecfg")
    data, secs = sections(path)
    for at, operand, target in sites:
        where = f"ldtilecfg at {at:#x} ({operand})"
        if "(%rip)" not in operand or target is None:
            problems.append(f"{where}: the configuration is not a constant of the library (built at run time, "
                            "where the compiler may drop its stores)")
            continue
        sec = [s for s in secs if s[1] <= target < s[1] + s[3] and s[1]]
        if not sec:
            problems.append(f"{where}: {target:#x} is in no section")
            continue
        name, addr, offset, size, flags = sec[0]
        if flags & SHF_WRITE:
            problems.append(f"{where}: the configuration lies in writable section {name}")
        if target + 64 > addr + size:
            problems.append(f"{where}: the 64 bytes run past section {name}")
            continue
        cfg = data[offset + target - addr: offset + target - addr + 64]
        palette, start_row = cfg[0], cfg[1]
        colsb = struct.unpack_from("<16H", cfg, 16)
        rows = cfg[48:64]
        if palette != 1 or start_row != 0 or any(cfg[2:16]):
            problems.append(f"{where}: palette {palette}, start_row {start_row}, reserved bytes "
                            f"{cfg[2:16].hex()}: not palette 1")
        if any(rows[t] != 16 or colsb[t] != 64 for t in range(8)) or any(rows[8:]) or any(colsb[8:]):
            problems.append(f"{where}: rows {list(rows[:8])}, bytes {list(colsb[:8])}: the kernels load "
                            "16 x 64 into tmm0..tmm7")
    return sites, problems


def library_under_test():
    from fmha import _lib

    _lib.load()
    return _lib.library_path()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AMX is x86-64's")
def test_every_ldtilecfg_reads_a_constant_configuration():
    path = library_under_test()
    sites, problems = tile_config_problems(path)
    assert not problems, f"{path}:\n  " + "\n  ".join(problems)
    assert sites


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else library_under_test()
    try:
        found, wrong = tile_config_problems(target)
    except pytest.skip.Exception as e:
        print(f"skip: {e}")
        sys.exit(0)
    print(f"{target}: {len(found)} ldtilecfg, {len(wrong)} problems")
    for p in wrong:
        print("  " + p)
    sys.exit(1 if wrong else 0)
