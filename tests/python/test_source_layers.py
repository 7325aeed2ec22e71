"""The library's layers (docs/design.md, "Layers"): every folder of src/
calls only the folders below it, and no two files call each other through
any chain. Read from the symbols of the build's objects (nm): a call is an
undefined symbol of one object that another object defines. Runs where the
build tree beside FMHA_LIBRARY holds the library's objects (the test
command's Release build); elsewhere (an installed wheel) it is skipped.
"""
import os
import shutil
import subprocess
from collections import defaultdict

import pytest

# the layers, bottom first: a folder may call only those before it
LAYERS = ["runtime", "format", "uk", "config", "core", "driver", "plan", "api"]


def _objects():
    lib = os.environ.get("FMHA_LIBRARY", "")
    root = os.path.join(os.path.dirname(lib), "CMakeFiles", "fmha_objects.dir", "src")
    if not lib or not os.path.isdir(root) or not shutil.which("nm"):
        pytest.skip("no build tree with the library's objects beside FMHA_LIBRARY")
    objs = []
    for dirpath, _, files in os.walk(root):
        objs += [os.path.join(dirpath, f) for f in files if f.endswith(".o")]
    return root, objs


def _calls():
    root, objs = _objects()
    defined, wanted = {}, defaultdict(set)
    for path in objs:
        rel = os.path.relpath(path, root)
        out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in "TDRBC":
                defined[parts[2]] = rel
            elif len(parts) == 2 and parts[0] == "U":
                wanted[rel].add(parts[1])
    calls = defaultdict(set)
    for rel, symbols in wanted.items():
        for s in symbols:
            if s in defined and defined[s] != rel:
                calls[rel].add((defined[s], s))
    return calls


def _cycle(graph):
    """A cycle of graph (node -> set of nodes) as a list, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_folders_call_only_the_layers_below():
    wrong = []
    for rel, targets in _calls().items():
        src = rel.split(os.sep)[0]
        for target, symbol in targets:
            dst = target.split(os.sep)[0]
            if src != dst and (src not in LAYERS or dst not in LAYERS or LAYERS.index(dst) > LAYERS.index(src)):
                wrong.append(f"{rel} calls {symbol} of {target}")
    assert not wrong, "calls against the layers: " + "; ".join(sorted(wrong)[:10])


def test_no_cycle_among_files():
    graph = {rel: {t for t, _ in targets} for rel, targets in _calls().items()}
    assert _cycle(graph) is None, f"files calling each other: {' -> '.join(_cycle(graph))}"
