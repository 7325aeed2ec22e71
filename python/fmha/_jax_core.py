"""_jax_core: what fmha.jax and its ring attention (_jax_ring) share: the
JAX FFI library (found prebuilt in the package or compiled on first use,
then registered) and the two custom calls on it, "fmha_forward" and
"fmha_backward", with their static options (_Config). It sits below the
public module so that fmha.jax and _jax_ring both import it and neither
imports the other. The operand and attribute names the handler expects
come from _spec.
"""

import collections
import ctypes
import fcntl
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
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("fmha.jax needs JAX: pip install jax") from e

from . import _lib, _spec

_FFI_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ffi")
_FFI_SOURCE = os.path.join(_FFI_DIR, "fmha_jax_ffi.c")
_FFI_PREBUILT = os.path.join("_ffi", "fmha_jax_ffi.so")         # next to the package's libfmha.so
_FFI_PREBUILT_INFO = os.path.join("_ffi", "fmha_jax_ffi.json")

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
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise ImportError(f"fmha.jax: {why_not_prebuilt}, and no C compiler was found to build its FFI handler "
                      "(set CC, or install gcc; or rebuild fmha against this jax: pip install scikit-build-core, "
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
    cc = _compiler(why_not_prebuilt)
    import jaxlib

    h = hashlib.sha256()
    for part in (open(_FFI_SOURCE, "rb").read(), open(header, "rb").read(), jaxlib.__version__.encode(),
                 include.encode(), cc.encode(), lib_path.encode()):
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
        cmd = [cc, "-O2", "-std=c11", "-shared", "-fPIC", "-fvisibility=hidden", "-w",
               f"-I{include}", f"-I{os.path.dirname(header)}", _FFI_SOURCE, lib_path,
               f"-Wl,-rpath,{os.path.dirname(lib_path)}", "-pthread", "-o", tmp]
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
    for target, symbol in _spec.FFI_TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(handle, symbol)), platform="cpu")
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

# cfg: the static options, hashable (custom_vjp's nondiff argument).
_Config = collections.namedtuple("_Config", "scale causal window strategy softcap precision rel_max_distance "
                                            "rel_bidirectional dropout_p")
_ATTR_TYPES = {"f32": np.float32, "i64": np.int64}  # _spec.FFI_ATTRS' kinds


def _attrs(cfg, extras):
    """The forward's FFI attributes (_spec.FFI_ATTRS, in order) of cfg and the extras bit set."""
    values = dict(cfg._asdict(), window_left=cfg.window[0], window_right=cfg.window[1], extras=extras)
    return {name: _ATTR_TYPES[kind](values[name]) for name, kind in _spec.FFI_ATTRS}


def _extras(extras):
    """The operands present of the dict `extras` (name -> array or None), in
    the handler's order, and their bit set."""
    ops, bits = [], 0
    for name in _spec.EXTRA_NAMES:
        if extras[name] is not None:
            ops.append(extras[name])
            bits |= _spec.EXTRA_BITS[name]
    return ops, bits


def _forward(q, k, v, extras, cfg):
    ops, bits = _extras(extras)
    B, T, N, _ = q.shape
    out_types = (jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),
                 jax.ShapeDtypeStruct((B, N, T), jnp.float32))
    call = jax.ffi.ffi_call("fmha_forward", out_types, vmap_method="expand_dims")
    o, lse = call(q, k, v, *ops, **_attrs(cfg, bits))
    return o, lse


def _backward(q, k, v, o, lse, d_o, extras, cfg, wanted):
    """dq, dk, dv, then the gradient of each parameter named in `wanted` (in _spec.GRAD_NAMES order)."""
    ops, bits = _extras(extras)
    out_types = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    grad_bits = 0
    for name in _spec.GRAD_NAMES:
        if name in wanted:
            out_types.append(jax.ShapeDtypeStruct(extras[name].shape, jnp.float32))
            grad_bits |= _spec.GRAD_BITS[name]
    call = jax.ffi.ffi_call("fmha_backward", tuple(out_types), vmap_method="expand_dims")
    return call(q, k, v, o, lse, d_o, *ops, grads=np.int64(grad_bits), **_attrs(cfg, bits))
