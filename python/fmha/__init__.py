"""fmha: fused multi-head attention for CPUs, the Python side.

It holds the bindings to libfmha: fmha.attention / fmha.attention_backward
on NumPy arrays (fmha.api), fmha.jax.dot_product_attention (JAX FFI),
fmha.flax.dot_product_attention (flax's attention_fn, on fmha.jax) and
fmha.torch.scaled_dot_product_attention (PyTorch custom op). The tools sit
in fmha.tools: fmha-bench's report (python -m fmha.tools.report) and the
peer benchmark (python -m fmha.tools.bench_peers; the former names
fmha.report and fmha.bench_peers forward to them). The names below load
libfmha.so on first use, so `import fmha` needs neither the library, JAX nor
PyTorch.
"""

try:  # written into an installed package by its build, from CMakeLists.txt
    from ._version import __version__
except ImportError:  # a source checkout: read CMakeLists.txt's project version
    def _source_version():
        import os
        import re

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "CMakeLists.txt")
        try:
            with open(path) as f:
                m = re.search(r"project\(fmha VERSION ([0-9.]+)", f.read())
        except OSError:
            m = None
        return m.group(1) if m else "0+unknown"

    __version__ = _source_version()

_LAZY = {
    "attention": "api", "attention_backward": "api", "merge": "api", "MaskCallback": "api", "BiasCallback": "api",
    "describe": "api", "quantize_kv": "api",
    "FmhaError": "_lib", "FmhaArgumentError": "_lib", "set_num_threads": "_lib", "get_num_threads": "_lib", "isa_name": "_lib",
    "version_string": "_lib", "tune": "_lib", "tuning_status": "_lib",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
