"""test_layers: the import structure of the fmha package, read from its
source with ast (nothing is imported, so neither the library, JAX nor
PyTorch is needed). No module imports another that imports it back,
directly or around a longer cycle; imports inside functions count too. The
layers below the public modules (_spec, _lib, api and the private shared
modules) import no public module and no tool."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "fmha"


def module_names():
    """{dotted name: path} of every module of the package."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("fmha",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name, path, modules):
    """The package's modules that `name` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # from pkg import submodule
    return {m for m in found if m in modules and m != name}


def graph():
    modules = module_names()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_the_package():
    edges = graph()
    assert {"fmha.jax", "fmha.torch", "fmha._spec", "fmha._jax_core", "fmha._torch_core",
            "fmha.tools.report"} <= set(edges)
    # a few edges the source is known to hold
    assert "fmha._jax_core" in edges["fmha._jax_ring"]
    assert "fmha._torch_core" in edges["fmha._torch_flex"]
    assert "fmha.jax" in edges["fmha.tools.bench_peers"]  # an import inside a function
    assert "fmha.tools.report" in edges["fmha.report"]


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_lower_layers_import_no_public_module():
    edges = graph()
    lower = {name for name in edges if name.count(".") == 1 and name.split(".")[1].startswith("_")} | {"fmha.api"}
    assert {"fmha._spec", "fmha._lib", "fmha._jax_core", "fmha._jax_ring", "fmha._torch_core", "fmha._torch_ring",
            "fmha._torch_flex"} <= lower
    for name in sorted(lower):
        above = sorted(edges[name] - lower - {"fmha"})  # "from . import x" names the package, whose __init__ is lazy
        assert not above, f"{name} imports {above}, above its layer"
    assert edges["fmha._spec"] == set(), "_spec is the bottom: it imports nothing of the package"
