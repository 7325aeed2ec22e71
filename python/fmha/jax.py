"""fmha.jax: jax.nn.dot_product_attention's signature, served by fmha's C
kernels through JAX's FFI.

The two XLA CPU custom calls ("fmha_forward", "fmha_backward") live in
_ffi/fmha_jax_ffi.cc. An installed package ships them compiled
(_ffi/fmha_jax_ffi.so, built with the package against the jaxlib present
then); it is used when the package's own libfmha.so is loaded and the
running jaxlib serves the XLA FFI API version it was built for (same major,
same or newer minor; _ffi/fmha_jax_ffi.json records it). Otherwise (a
source checkout, FMHA_LIBRARY, another jaxlib, a package built without jax)
the file is compiled on first use with the system C++ compiler (CXX, else
c++/g++) against jax.ffi.include_dir() and fmha.h, linked to the libfmha.so
that fmha._lib loaded, and cached under FMHA_FFI_CACHE (default
~/.cache/fmha/ffi), keyed by a hash of its inputs. The handlers run fmha
plans on XLA's buffers, kept in a bounded cache keyed by the whole C problem
(plan_cache_info); nothing is computed in Python.

Differentiation: a jax.custom_vjp whose backward is fmha_backward, fed the
log-sum-exp saved by the forward. Gradients flow to query, key, value and
bias; the bias gradient is computed only when bias is differentiated.

vmap: ffi_call's vmap_method="expand_dims". Unbatched operands gain a
size-1 leading dimension and the handlers accept any number of leading
dimensions (size 1 broadcasts); they fold them into the batch, or loop over
them when an operand broadcasts. One custom call per vmapped call, no
Python loop, and exact for every batching pattern.

Rows that see no key at all (a fully masked row) give zeros here (the C
library's rule), where jax.nn.dot_product_attention averages every value.
"""

import ctypes
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.jax needs JAX: pip install jax") from e

from . import _lib, api
from ._lib import FmhaError

__all__ = ["dot_product_attention", "ffi_library_path", "FmhaError"]

_FFI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ffi")
_FFI_SOURCE = os.path.join(_FFI_DIR, "fmha_jax_ffi.cc")
_FFI_PREBUILT = os.path.join("_ffi", "fmha_jax_ffi.so")         # next to the package's libfmha.so
_FFI_PREBUILT_INFO = os.path.join("_ffi", "fmha_jax_ffi.json")
_EXTRA_BIAS, _EXTRA_MASK, _EXTRA_QLEN, _EXTRA_KVLEN = 1, 2, 4, 8

# ---- building and registering the FFI library ------------------------------------------

_register_lock = threading.Lock()
_ffi_path = None
_ffi_handle = None


def _cache_dir():
    d = os.environ.get("FMHA_FFI_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "fmha", "ffi")
    try:
        os.makedirs(d, exist_ok=True)
        if os.access(d, os.W_OK):
            return d
    except OSError:
        pass
    d = os.path.join(tempfile.gettempdir(), f"fmha-ffi-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def _compiler(why_not_prebuilt):
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise ImportError(f"fmha.jax: {why_not_prebuilt}, and no C++ compiler was found to build its FFI handler "
                      "(set CXX, or install g++; or rebuild fmha against this jax: pip install scikit-build-core, "
                      "then pip install --no-build-isolation --force-reinstall --no-deps <fmha source>)")


def _jaxlib_version():
    try:
        from jaxlib.version import __version__ as v
    except ImportError:  # pragma: no cover - older jaxlib layouts
        import jaxlib

        v = getattr(jaxlib, "__version__", "unknown")
    return v


def _runtime_ffi_api():
    """(major, minor) XLA FFI API version of the running jaxlib, read from the
    headers it ships; None when they are absent."""
    try:
        with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
            text = f.read()
    except OSError:
        return None
    found = [re.search(rf"^#define XLA_FFI_API_{part} (\d+)", text, re.M) for part in ("MAJOR", "MINOR")]
    return tuple(int(m.group(1)) for m in found) if all(found) else None


def _prebuilt():
    """(path, None) for the handler shipped in the package when it may serve
    this process, else (None, the reason it may not)."""
    lib_dir = os.path.dirname(os.path.realpath(_lib.library_path()))
    if lib_dir not in {os.path.realpath(d) for d in _lib.package_dirs()}:
        return None, (f"libfmha was loaded from {_lib.library_path()}, not from an installed fmha package "
                      "(a source checkout or FMHA_LIBRARY), so the prebuilt JAX FFI handler does not apply")
    prebuilt, info_path = os.path.join(lib_dir, _FFI_PREBUILT), os.path.join(lib_dir, _FFI_PREBUILT_INFO)
    if not os.path.isfile(prebuilt):
        return None, "this fmha package was built without jax, so it ships no prebuilt JAX FFI handler"
    try:
        with open(info_path) as f:
            info = json.load(f)
        built_jaxlib, built_api = info["jaxlib"], tuple(info["ffi_api"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{info_path} is missing or unreadable"
    running = _jaxlib_version()
    if running == built_jaxlib:
        return prebuilt, None
    api = _runtime_ffi_api()
    if api is not None and api[0] == built_api[0] and api[1] >= built_api[1]:
        return prebuilt, None
    shown = "unknown" if api is None else f"{api[0]}.{api[1]}"
    return None, (f"the prebuilt FFI handler was built for jaxlib {built_jaxlib} (XLA FFI API "
                  f"{built_api[0]}.{built_api[1]}) and this jaxlib {running} serves XLA FFI API {shown}")


def _build():
    """Path of the FFI library: the handler shipped in the package when it
    serves this process, else one compiled into the cache (built now when
    the cache lacks it)."""
    path, why_not = _prebuilt()
    if path is not None:
        return path
    return _compile(why_not)


def _compile(why_not_prebuilt):
    header = _lib.header_path()
    if header is None:
        raise ImportError("fmha.jax: fmha.h not found (set FMHA_INCLUDE_DIR to the directory holding it)")
    lib_path = _lib.library_path()
    include = jax.ffi.include_dir()
    cxx = _compiler(why_not_prebuilt)
    import jaxlib

    h = hashlib.sha256()
    for part in (open(_FFI_SOURCE, "rb").read(), open(header, "rb").read(), jaxlib.__version__.encode(),
                 include.encode(), cxx.encode(), lib_path.encode()):
        h.update(part)
        h.update(b"\0")
    d = _cache_dir()
    target = os.path.join(d, f"fmha_jax_ffi-{h.hexdigest()[:20]}.so")
    if os.path.isfile(target):
        return target
    with open(os.path.join(d, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(target):
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
        os.close(fd)
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
               f"-I{include}", f"-I{os.path.dirname(header)}", _FFI_SOURCE, lib_path,
               f"-Wl,-rpath,{os.path.dirname(lib_path)}", "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise ImportError("fmha.jax: building the FFI library failed:\n" + " ".join(cmd) + "\n" +
                              proc.stderr[-4000:])
        os.replace(tmp, target)
    return target


def _ensure_registered():
    global _ffi_path, _ffi_handle
    if _ffi_handle is not None:
        return
    with _register_lock:
        if _ffi_handle is not None:
            return
        _lib.load()  # first, so that the FFI library binds to this libfmha
        path, why_not = _prebuilt()
        handle = None
        if path is not None:
            try:
                handle = _register(path)
            except Exception as e:  # XLA refused it after all: build one for this jaxlib
                path, why_not = None, f"the prebuilt FFI handler could not be registered ({e})"
        if handle is None:
            path = _compile(why_not)
            handle = _register(path)
        _ffi_path, _ffi_handle = path, handle


def _register(path):
    handle = ctypes.CDLL(path)
    jax.ffi.register_ffi_target("fmha_forward", jax.ffi.pycapsule(handle.fmha_ffi_forward), platform="cpu")
    jax.ffi.register_ffi_target("fmha_backward", jax.ffi.pycapsule(handle.fmha_ffi_backward), platform="cpu")
    return handle


def ffi_library_path():
    """The FFI library in use: the package's prebuilt handler or the one
    compiled on first call."""
    _ensure_registered()
    return _ffi_path


def plan_cache_info():
    """The handlers' plan cache (one per process): dict(size, capacity, hits, misses)."""
    _ensure_registered()
    stats = (ctypes.c_int64 * 4)()
    _ffi_handle.fmha_ffi_plan_cache_stats(stats)
    return dict(zip(("size", "capacity", "hits", "misses"), (int(x) for x in stats)))


def plan_cache_clear():
    """Drops every cached plan (each is freed once no run holds it) and zeroes the counts."""
    _ensure_registered()
    _ffi_handle.fmha_ffi_plan_cache_clear()


# ---- the custom calls --------------------------------------------------------------------

def _attrs(cfg, extras):
    scale, causal, window, strategy = cfg
    return dict(scale=np.float32(scale), causal=np.int64(causal), window_left=np.int64(window[0]),
                window_right=np.int64(window[1]), strategy=np.int64(strategy), extras=np.int64(extras))


def _extras(bias, mask, q_lens, kv_lens):
    ops, bits = [], 0
    for bit, x in ((_EXTRA_BIAS, bias), (_EXTRA_MASK, mask), (_EXTRA_QLEN, q_lens), (_EXTRA_KVLEN, kv_lens)):
        if x is not None:
            ops.append(x)
            bits |= bit
    return ops, bits


def _forward(q, k, v, bias, mask, q_lens, kv_lens, cfg):
    ops, bits = _extras(bias, mask, q_lens, kv_lens)
    B, T, N, _ = q.shape
    out_types = (jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),
                 jax.ShapeDtypeStruct((B, N, T), jnp.float32))
    call = jax.ffi.ffi_call("fmha_forward", out_types, vmap_method="expand_dims")
    o, lse = call(q, k, v, *ops, **_attrs(cfg, bits))
    return o, lse


def _backward(q, k, v, o, lse, d_o, bias, mask, q_lens, kv_lens, cfg, bias_grad):
    ops, bits = _extras(bias, mask, q_lens, kv_lens)
    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if bias_grad:
        out_types.append(jax.ShapeDtypeStruct(bias.shape, jnp.float32))
    call = jax.ffi.ffi_call("fmha_backward", tuple(out_types), vmap_method="expand_dims")
    return call(q, k, v, o, lse, d_o, *ops, bias_grad=np.int64(bias_grad), **_attrs(cfg, bits))


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _attention(q, k, v, bias, mask, q_lens, kv_lens, cfg):
    return _forward(q, k, v, bias, mask, q_lens, kv_lens, cfg)


def _value(x):
    return getattr(x, "value", x)


def _attention_fwd(q, k, v, bias, mask, q_lens, kv_lens, cfg):
    # symbolic_zeros=True: the primals arrive as CustomVJPPrimal(value, perturbed).
    bias_grad = bias is not None and bool(getattr(bias, "perturbed", True))
    q, k, v, bias, mask, q_lens, kv_lens = map(_value, (q, k, v, bias, mask, q_lens, kv_lens))
    o, lse = _forward(q, k, v, bias, mask, q_lens, kv_lens, cfg)
    # The bias appears a second time, as a marker, when its gradient is wanted.
    return (o, lse), (q, k, v, bias, mask, q_lens, kv_lens, o, lse, bias if bias_grad else None)


def _attention_bwd(cfg, res, cotangents):
    q, k, v, bias, mask, q_lens, kv_lens, o, lse, bias_marker = res
    d_o = cotangents[0]  # lse's cotangent is ignored: it is a stop-gradient output
    bias_grad = bias_marker is not None
    if isinstance(d_o, SymbolicZero):
        zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in (q, k, v))
        return zeros + (jnp.zeros(bias.shape, bias.dtype) if bias_grad else None, None, None, None)
    grads = _backward(q, k, v, o, lse, d_o.astype(o.dtype), bias, mask, q_lens, kv_lens, cfg, bias_grad)
    d_bias = grads[3] if bias_grad else None
    return (grads[0], grads[1], grads[2], d_bias, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


# ---- the public function ---------------------------------------------------------------------

def _ensure_4d(x):
    x = jnp.asarray(x)
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x


def _check_config(dtype, B, N, K, T, S, H, Hv, cfg, has):
    """Raises FmhaError now (at trace time) for a request the library refuses."""
    scale, causal, window, strategy = cfg
    p = api.new_problem(dtype, (B, N, K, T, S, H, Hv), (T * N * H, N * H, H, 1), (S * K * H, K * H, H, 1),
                        (S * K * Hv, K * Hv, Hv, 1), (T * N * Hv, N * Hv, Hv, 1), scale=scale, causal=causal,
                        strategy=strategy, window=window)
    keep = []
    if has & _EXTRA_BIAS:
        one = np.zeros(1, np.float32)
        api.set_dense_bias(p, one.ctypes.data, [0, 0, 0, 0])
        keep.append(one)
    if has & _EXTRA_MASK:
        one = np.ones(1, np.uint8)
        api.set_dense_mask(p, one.ctypes.data, [0, 0, 0, 0])
        keep.append(one)
    for bit, field, n in ((_EXTRA_QLEN, "q_lengths", T), (_EXTRA_KVLEN, "kv_lengths", S)):
        if has & bit:
            lengths = np.full(B, n, np.int32)
            setattr(p.masks, field, ctypes.cast(ctypes.c_void_p(lengths.ctypes.data),
                                                ctypes.POINTER(ctypes.c_int32)))
            keep.append(lengths)
    _lib.check(_lib.load().fmha_problem_check(ctypes.byref(p)), "fmha.jax.dot_product_attention")


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False):
    """jax.nn.dot_product_attention computed by fmha's C kernels.

    Same arguments, shapes ([B, T, N, H] or [T, N, H]; GQA through fewer key
    heads) and results as jax.nn.dot_product_attention. implementation None
    (or 'fmha') runs fmha; 'xla' and 'cudnn' hand the call to
    jax.nn.dot_product_attention. dtypes: float32, bfloat16, float16.
    Requests the C library refuses raise FmhaError while tracing; errors
    found while running (e.g. a sequence length out of range) raise JAX's
    runtime error carrying the C message.
    """
    if implementation in ("xla", "cudnn"):
        return jax.nn.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size, implementation=implementation,
            return_residual=return_residual)
    if implementation not in (None, "fmha"):
        raise ValueError(f"Unsupported implementation option: {implementation}")

    output_shape = jnp.shape(query)
    q, k, v = _ensure_4d(query), _ensure_4d(key), _ensure_4d(value)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"query, key and value must be 3-D or 4-D, got {q.ndim}, {k.ndim}, {v.ndim} dims")
    B, S, K, H = k.shape
    if v.shape[:3] != (B, S, K):
        raise ValueError(f"value shape should be [{B}, {S}, {K}, Hv]: but got {v.shape}")
    if q.shape[0] != B or q.shape[3] != H:
        raise ValueError(f"query shape should be [{B}, -1, -1, {H}]: but got {q.shape}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    code = api.dtype_code(q.dtype)
    T, N = q.shape[1], q.shape[2]
    Hv = v.shape[3]
    if N % K != 0:
        raise ValueError(f"The number of query heads must be a multiple of key/value heads, but got {N} vs {K}")
    full = (B, N, T, S)
    has = 0
    if bias is not None:
        bias = _ensure_4d(bias)
        api.broadcast_strides(bias.shape, (1, 1, 1, 1), full, "bias")
        has |= _EXTRA_BIAS
    if mask is not None:
        mask = _ensure_4d(mask)
        if mask.dtype != np.bool_:
            raise ValueError(f"mask dtype should be bool, but got {mask.dtype}")
        api.broadcast_strides(mask.shape, (1, 1, 1, 1), full, "mask")
        has |= _EXTRA_MASK
    lengths = []
    for name, x, bit in (("query_seq_lengths", query_seq_lengths, _EXTRA_QLEN),
                         ("key_value_seq_lengths", key_value_seq_lengths, _EXTRA_KVLEN)):
        if x is not None:
            x = jnp.asarray(x)
            if x.shape != (B,):
                raise ValueError(f"{name} shape should be ({B},): but got {x.shape}")
            if x.dtype != np.int32:
                raise ValueError(f"{name} dtype should be int32, but got {x.dtype}")
            has |= bit
        lengths.append(x)
    scale_val = api.resolve_scale(scale, H)
    cfg = (scale_val, _lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE,
           api.window_sides(local_window_size), _lib.STRATEGIES["auto"])
    _check_config(code, B, N, K, T, S, H, Hv, cfg, has)
    _ensure_registered()

    if bias is not None:
        bias = bias.astype(jnp.float32)  # its gradient returns in the bias's own dtype
    out, lse = _attention(q, k, v, bias, mask, lengths[0], lengths[1], cfg)
    out = jnp.reshape(out, output_shape[:-1] + (Hv,))
    if return_residual:
        residual = jnp.transpose(lse, (0, 2, 1)).astype(k.dtype)  # [B, N, T] -> [B, T, N]
        return out, jnp.reshape(residual, output_shape[:-1])
    return out

