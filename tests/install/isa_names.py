"""isa_names.py: checks that a wheel's libfmha.so accepts the same FMHA_ISA
names as the CMake build's library, on this CPU. The wheels are compiled
by another compiler than the CMake build (zig cc: cmake/zig.cmake), so a
kernel table its compiler could not build would be missing from the wheel
without any other sign: FMHA_ISA falls back to the best table quietly.

For every name that include/fmha.h lists for FMHA_ISA, each library is
loaded in a process of its own with FMHA_ISA set to it (the table is chosen
once a process) and fmha_isa_name() is read through ctypes; the two must
answer the same for every name, and the reference must run at least one
name as itself. The processes run under sys.executable, so an emulated
Python checks emulated libraries. Prints one line; exit status 1 on a
difference.

  usage: python isa_names.py FMHA_H REFERENCE_LIB WHEEL_LIB
"""

import os
import re
import subprocess
import sys

PROBE = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); lib.fmha_isa_name.restype = ctypes.c_char_p; "
         "print(lib.fmha_isa_name().decode())")


def header_names(header):
    """The FMHA_ISA names of fmha.h's comments (FMHA_ISA=a|b|c), in order."""
    with open(header) as f:
        text = f.read()
    names = []
    for group in re.findall(r"FMHA_ISA=([a-z0-9_|]+)", text):
        names += [n for n in group.split("|") if n and n not in names]
    if not names:
        sys.exit(f"isa_names: no FMHA_ISA=... names in {header}")
    return names


def chosen(lib, name):
    """The table the library runs with FMHA_ISA=name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FMHA_")}
    env["FMHA_ISA"] = name
    out = subprocess.run([sys.executable, "-S", "-c", PROBE, lib], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"isa_names: loading {lib} with FMHA_ISA={name} failed:\n{out.stderr}")
    return out.stdout.strip()


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("usage: ")[1])
    header, ref, wheel = sys.argv[1:]
    names = header_names(header)
    differ, own = [], []
    for name in names:
        a, b = chosen(ref, name), chosen(wheel, name)
        if a != b:
            differ.append(f"FMHA_ISA={name}: the CMake build runs {a}, the wheel {b}")
        elif a == name:
            own.append(name)
    if differ:
        sys.exit("isa_names: the wheel's library and the CMake build's differ:\n  " + "\n  ".join(differ))
    if not own:
        sys.exit(f"isa_names: the CMake build ran none of {' '.join(names)} as itself")
    others = [n for n in names if n not in own]
    print(f"isa_names: the wheel's library runs {' '.join(own)} as the CMake build's does"
          + (f" (and falls back as it does for {' '.join(others)})" if others else ""))


if __name__ == "__main__":
    main()
