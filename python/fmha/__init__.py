"""fmha: fused multi-head attention for CPUs, the Python side.

It holds fmha-bench's report (python -m fmha.report) and the bindings to
libfmha: fmha.attention / fmha.attention_backward on NumPy arrays (fmha.api),
fmha.jax.dot_product_attention (JAX FFI) and
fmha.torch.scaled_dot_product_attention (PyTorch custom op); the peer
benchmark is python -m fmha.bench_peers. The names below load libfmha.so on
first use, so `import fmha` needs neither the library, JAX nor PyTorch.
"""

__version__ = "0.1.0"

_LAZY = {
    "attention": "api", "attention_backward": "api", "MaskCallback": "api", "BiasCallback": "api",
    "FmhaError": "_lib", "set_num_threads": "_lib", "get_num_threads": "_lib", "isa_name": "_lib",
    "version_string": "_lib",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
