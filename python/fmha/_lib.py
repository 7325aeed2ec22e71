"""_lib: loads libfmha.so with ctypes and mirrors the C API of fmha.h.

The structs below follow include/fmha.h field by field (ctypes applies the
same alignment rules as the C compiler); tests/python/test_numpy_api.py
compiles a C program that prints the real offsets and compares. Every other
module reaches the library through `load()` and `check()`.
"""

import collections
import ctypes
import os
import threading

from ._spec import CAUSAL_BOTTOM_RIGHT, CAUSAL_NONE, CAUSAL_NONE_BOTTOM_RIGHT, CAUSAL_TOP_LEFT  # noqa: F401

# ---- status codes and the error they raise -------------------------------------

STATUS_NAMES = (
    "FMHA_OK",
    "FMHA_ERR_NULL_POINTER",
    "FMHA_ERR_BAD_SIZE",
    "FMHA_ERR_BAD_HEADS",
    "FMHA_ERR_BAD_HEAD_DIM",
    "FMHA_ERR_BAD_SCALE",
    "FMHA_ERR_BAD_STRIDE",
    "FMHA_ERR_OVERLAP",
    "FMHA_ERR_BAD_OPTION",
    "FMHA_ERR_UNSUPPORTED",
    "FMHA_ERR_WORKSPACE_TOO_SMALL",
    "FMHA_ERR_OUT_OF_MEMORY",
    "FMHA_ERR_BAD_THREAD_COUNT",
    "FMHA_ERR_BAD_MASK",
    "FMHA_ERR_CALLBACK",
    "FMHA_ERR_STRUCT_SIZE",
    "FMHA_ERR_BAD_PAGE",
    "FMHA_ERR_BAD_FILE",
)
(OK, ERR_NULL_POINTER, ERR_BAD_SIZE, ERR_BAD_HEADS, ERR_BAD_HEAD_DIM, ERR_BAD_SCALE, ERR_BAD_STRIDE,
 ERR_OVERLAP, ERR_BAD_OPTION, ERR_UNSUPPORTED, ERR_WORKSPACE_TOO_SMALL, ERR_OUT_OF_MEMORY,
 ERR_BAD_THREAD_COUNT, ERR_BAD_MASK, ERR_CALLBACK, ERR_STRUCT_SIZE, ERR_BAD_PAGE, ERR_BAD_FILE) = range(len(STATUS_NAMES))

DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
STRATEGIES = {"auto": 0, "tiled": 1, "dense": 2, "portable": 3}
# CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT (fmha_causal) and the
# bindings' CAUSAL_NONE_BOTTOM_RIGHT come from _spec (imported above).
ALIGN_CAUSAL, ALIGN_TOP_LEFT, ALIGN_BOTTOM_RIGHT = 0, 1, 2
LAYOUT_BSHD, LAYOUT_BHSD = 0, 1
TILE_EMPTY, TILE_FULL, TILE_PARTIAL = 0, 1, 2
MAX_HEAD_DIM = 576


class FmhaError(RuntimeError):
    """A non-zero fmha_status. `status` is the code, `name` its enum name, the
    message is fmha_status_string's sentence and `detail` the library's
    fmha_last_error_message (the argument at fault, what it must be and what
    it was), "" when there is none. A status that means a bad argument
    (ARGUMENT_STATUSES) makes an FmhaArgumentError, which is also a
    ValueError; `except FmhaError` and `except RuntimeError` catch every one."""

    def __new__(cls, status, *args, **kwargs):
        if cls is FmhaError and _is_argument_status(status):
            cls = FmhaArgumentError
        return super().__new__(cls, status, *args, **kwargs)

    def __init__(self, status, message=None, context=None, detail=""):
        self.status = int(status)
        self.name = STATUS_NAMES[self.status] if 0 <= self.status < len(STATUS_NAMES) else "FMHA_ERR_?"
        if message is None:
            message = status_string(self.status)
        self.c_message = message
        self.detail = detail or ""
        text = f"{message}: {self.detail} ({self.name})" if self.detail else f"{message} ({self.name})"
        if context:
            text = f"{context}: {text}"
        super().__init__(text)

    @property
    def unsupported(self):
        return self.status == ERR_UNSUPPORTED


class FmhaArgumentError(FmhaError, ValueError):
    """An FmhaError whose status means a bad argument (a size, stride, head
    count, option, mask, page ...): a ValueError like the bindings' own
    checks, and still an FmhaError and a RuntimeError."""


# Statuses of a bad argument, not of a limit of the library (UNSUPPORTED) or
# of the machine (OUT_OF_MEMORY).
ARGUMENT_STATUSES = frozenset({
    ERR_NULL_POINTER, ERR_BAD_SIZE, ERR_BAD_HEADS, ERR_BAD_HEAD_DIM, ERR_BAD_SCALE, ERR_BAD_STRIDE, ERR_OVERLAP,
    ERR_BAD_OPTION, ERR_WORKSPACE_TOO_SMALL, ERR_BAD_THREAD_COUNT, ERR_BAD_MASK, ERR_CALLBACK, ERR_STRUCT_SIZE,
    ERR_BAD_PAGE,
})


def _is_argument_status(status):
    try:
        return int(status) in ARGUMENT_STATUSES
    except (TypeError, ValueError):
        return False


# ---- struct mirrors --------------------------------------------------------------

class fmha_tile(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("head_q", ctypes.c_int64),
        ("q0", ctypes.c_int64),
        ("nq", ctypes.c_int64),
        ("k0", ctypes.c_int64),
        ("nk", ctypes.c_int64),
        ("q_stride", ctypes.c_ssize_t),   # ptrdiff_t
        ("k_stride", ctypes.c_ssize_t),
        ("thread", ctypes.c_int),
    ]


MASK_CLASSIFY_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(fmha_tile))
MASK_FILL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(fmha_tile),
                                ctypes.POINTER(ctypes.c_uint8))
BIAS_FILL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(fmha_tile),
                                ctypes.POINTER(ctypes.c_float))
BIAS_GRAD_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(fmha_tile),
                                ctypes.POINTER(ctypes.c_float))


class fmha_mask_callback(ctypes.Structure):
    _fields_ = [
        ("classify", MASK_CLASSIFY_FN),
        ("fill", MASK_FILL_FN),
        ("ctx", ctypes.c_void_p),
    ]


class fmha_bias_callback(ctypes.Structure):
    _fields_ = [
        ("fill", BIAS_FILL_FN),
        ("accumulate_grad", BIAS_GRAD_FN),
        ("ctx", ctypes.c_void_p),
    ]


class fmha_masks(ctypes.Structure):
    _fields_ = [
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("kv_lengths", ctypes.POINTER(ctypes.c_int32)),
        ("q_lengths", ctypes.POINTER(ctypes.c_int32)),
        ("q_segment_ids", ctypes.POINTER(ctypes.c_int32)),
        ("kv_segment_ids", ctypes.POINTER(ctypes.c_int32)),
        ("dense", ctypes.POINTER(ctypes.c_uint8)),
        ("dense_strides", ctypes.c_int64 * 4),
        ("callback", fmha_mask_callback),
    ]


class fmha_biases(ctypes.Structure):
    _fields_ = [
        ("dense", ctypes.POINTER(ctypes.c_float)),
        ("dense_strides", ctypes.c_int64 * 4),
        ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
        ("rel_table", ctypes.POINTER(ctypes.c_float)),
        ("rel_num_buckets", ctypes.c_int32),
        ("rel_max_distance", ctypes.c_int32),
        ("rel_bidirectional", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("callback", fmha_bias_callback),
    ]


class fmha_param_grads(ctypes.Structure):
    _fields_ = [
        ("d_dense", ctypes.POINTER(ctypes.c_float)),
        ("d_dense_strides", ctypes.c_int64 * 4),
        ("d_alibi", ctypes.POINTER(ctypes.c_float)),
        ("d_rel_table", ctypes.POINTER(ctypes.c_float)),
    ]


class fmha_problem(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("batch", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("seq_q", ctypes.c_int64),
        ("seq_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("strategy", ctypes.c_int),
        ("precision", ctypes.c_int),
        ("q_strides", ctypes.c_int64 * 4),
        ("k_strides", ctypes.c_int64 * 4),
        ("v_strides", ctypes.c_int64 * 4),
        ("o_strides", ctypes.c_int64 * 4),
        ("masks", fmha_masks),
        ("biases", fmha_biases),
        ("sinks", ctypes.POINTER(ctypes.c_float)),
        ("block_table", ctypes.POINTER(ctypes.c_int32)),
        ("block_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("kv_dtype", ctypes.c_int),
        ("alignment", ctypes.c_int64),
        ("k_format", ctypes.c_int64),
        ("v_format", ctypes.c_int64),
        ("k_scales", ctypes.POINTER(ctypes.c_float)),
        ("v_scales", ctypes.POINTER(ctypes.c_float)),
        ("k_scale_strides", ctypes.c_int64 * 3),
        ("v_scale_strides", ctypes.c_int64 * 3),
    ]


# ---- loading -----------------------------------------------------------------------

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_PACKAGE_DIR))

BUILD_HINT = (
    "An installed fmha package carries libfmha.so: reinstall it (pip install <fmha repository or "
    "wheel>). In a source checkout, build it with `cmake -S . -B build -G Ninja "
    "-DCMAKE_BUILD_TYPE=Release && cmake --build build`, or set FMHA_LIBRARY to a libfmha.so"
)


def package_dirs():
    """The fmha package's directories: one when installed; with an editable
    install (pip install -e .), the built files' and the source's."""
    import sys

    dirs = list(getattr(sys.modules.get(__package__), "__path__", None) or [])
    return [os.path.abspath(d) for d in dirs] or [_PACKAGE_DIR]


def library_candidates():
    """Where libfmha.so is looked for, in order: FMHA_LIBRARY (a developer's
    override, alone when set), the copy inside this package (an installed
    package), the build/ directory of a source checkout."""
    env = os.environ.get("FMHA_LIBRARY")
    if env:
        return [env]
    return [os.path.join(d, "libfmha.so") for d in package_dirs()] + [os.path.join(_REPO_ROOT, "build", "libfmha.so")]


def header_path():
    """fmha.h of this library, in a directory that also holds the generated
    fmha_version.h: FMHA_INCLUDE_DIR, the package's include/ (an installed
    package), include/ next to the library (a CMake build tree), else None."""
    dirs = [os.environ.get("FMHA_INCLUDE_DIR")] + [os.path.join(d, "include") for d in package_dirs()]
    libs = ([_lib_path] if _lib_path else []) + library_candidates()
    dirs += [os.path.join(os.path.dirname(os.path.abspath(p)), "include") for p in libs]
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, "fmha.h")) and os.path.isfile(os.path.join(d, "fmha_version.h")):
            return os.path.join(d, "fmha.h")
    return None


_lock = threading.Lock()
_lib = None
_lib_path = None


# fmha_tune_progress_fn: (void *user, const char *line)
TUNE_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


def _declare(lib):
    P = ctypes.POINTER
    c_void_p, c_int, c_size_t = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    prob = P(fmha_problem)
    sigs = {
        "fmha_status_string": (ctypes.c_char_p, [c_int]),
        "fmha_problem_init": (None, [prob] + [ctypes.c_int64] * 7 + [c_int]),
        "fmha_problem_check": (c_int, [prob]),
        "fmha_forward_workspace_size": (c_int, [prob, P(c_size_t)]),
        "fmha_forward": (c_int, [prob, c_void_p, c_void_p, c_void_p, c_void_p, P(ctypes.c_float),
                                 c_void_p, c_size_t]),
        "fmha_backward_workspace_size": (c_int, [prob, P(c_size_t)]),
        "fmha_backward": (c_int, [prob, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                  P(ctypes.c_float), c_void_p, c_void_p, c_void_p,
                                  P(fmha_param_grads), c_void_p, c_size_t]),
        "fmha_forward_backward": (c_int, [prob, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                                          P(ctypes.c_float), c_void_p, c_void_p, c_void_p,
                                          P(fmha_param_grads)]),
        # Plans: the handle is a c_void_p; tensors are c_void_p too, so that
        # the hot path passes plain integer addresses (no pointer objects).
        "fmha_plan_create": (c_int, [prob, P(c_void_p)]),
        "fmha_plan_forward": (c_int, [c_void_p] * 6),
        "fmha_plan_backward": (c_int, [c_void_p] * 10 + [P(fmha_param_grads)]),
        "fmha_plan_forward_backward": (c_int, [c_void_p] * 10 + [P(fmha_param_grads)]),
        "fmha_plan_problem": (P(fmha_problem), [c_void_p]),
        "fmha_plan_workspace_held": (c_size_t, [c_void_p]),
        "fmha_plan_destroy": (None, [c_void_p]),
        "fmha_sinks_backward": (c_int, [prob, c_void_p, c_void_p, P(ctypes.c_float), P(ctypes.c_float)]),
        "fmha_dropout_keep": (c_int, [prob] + [ctypes.c_int64] * 4),
        "fmha_merge": (c_int, [ctypes.c_int64] * 4 + [P(ctypes.c_int64)] + [P(ctypes.c_float)] * 6),
        "fmha_set_num_threads": (c_int, [c_int]),
        "fmha_get_num_threads": (c_int, []),
        "fmha_isa_name": (ctypes.c_char_p, []),
        "fmha_tuning_status": (ctypes.c_char_p, []),
        "fmha_tune": (c_int, [ctypes.c_char_p, ctypes.c_double, TUNE_PROGRESS, c_void_p]),
        "fmha_last_error_message": (ctypes.c_char_p, []),
        "fmha_plan_describe": (c_size_t, [c_void_p, ctypes.c_char_p, c_size_t]),
        "fmha_version_string": (ctypes.c_char_p, []),
        "fmha_kv_quantize": (c_int, [c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, c_void_p,
                                     P(ctypes.c_int64), c_void_p, P(ctypes.c_int64), c_void_p, P(ctypes.c_int64)]),
        "fmha_kv_format_row_bytes": (c_size_t, [c_int, ctypes.c_int64]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # Optional (newer headers): the T5 bucket the rel_table bias uses.
    if hasattr(lib, "fmha_rel_bucket"):
        lib.fmha_rel_bucket.restype = ctypes.c_int32
        lib.fmha_rel_bucket.argtypes = [ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, c_int]


def load():
    """The loaded library (once per process). ImportError when it is missing."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in library_candidates():
            if not os.path.isfile(path):
                tried.append(f"{path} (absent)")
                continue
            try:
                # RTLD_GLOBAL: the JAX FFI library links libfmha and must bind
                # to this same instance (one thread pool, one thread setting).
                lib = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(lib)
            _lib, _lib_path = lib, os.path.abspath(path)
            return _lib
        raise ImportError("fmha: cannot load libfmha.so; tried " + "; ".join(tried) + ". " + BUILD_HINT)


def library_path():
    load()
    return _lib_path


def status_string(status):
    if _lib is None:
        return STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "unknown fmha status"
    return _lib.fmha_status_string(int(status)).decode()


def last_error_message():
    """fmha_last_error_message of this thread: why its last fmha call failed ("" if it did not)."""
    lib = load()
    return lib.fmha_last_error_message().decode() if hasattr(lib, "fmha_last_error_message") else ""


def check(status, context=None):
    """Raises FmhaError for a non-zero status, with the library's detail."""
    if status != OK:
        raise FmhaError(status, status_string(status), context, last_error_message())


# ---- small helpers over the library --------------------------------------------------

def problem_init(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, head_dim_v, layout=LAYOUT_BSHD):
    p = fmha_problem()
    load().fmha_problem_init(ctypes.byref(p), batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                             head_dim_v, layout)
    return p


def set_num_threads(n):
    """Fixes the library's thread count (n > 0) or restores the default (n == 0)."""
    check(load().fmha_set_num_threads(int(n)), "fmha_set_num_threads")


def get_num_threads():
    return int(load().fmha_get_num_threads())


def isa_name():
    return load().fmha_isa_name().decode()


def tuning_status():
    """fmha_tuning_status: where the kernel table in use took its tuning and what became of the
    wisdom files (FMHA_WISDOM, the per-user one), with the reason when one was refused."""
    return load().fmha_tuning_status().decode()


def tune(path=None, budget_s=0.0, progress=None):
    """fmha_tune: measures this CPU's tunings (about budget_s seconds; 0: 90) and writes them
    into the wisdom file at path (None: the per-user one, ~/.cache/fmha/wisdom.json), which
    processes started afterwards read. progress(line) is called with each step's line.
    Raises FmhaError (FMHA_ERR_BAD_FILE) when path holds something else than wisdom."""
    callback = TUNE_PROGRESS(lambda user, line: progress(line.decode())) if progress else TUNE_PROGRESS()
    check(load().fmha_tune(os.fsencode(path) if path is not None else None, float(budget_s), callback, None),
          "fmha_tune")


def version_string():
    return load().fmha_version_string().decode()


def rel_bucket(rel, num_buckets, max_distance, bidirectional):
    """fmha_rel_bucket of the library, or None when this build lacks it."""
    lib = load()
    if not hasattr(lib, "fmha_rel_bucket"):
        return None
    return int(lib.fmha_rel_bucket(int(rel), int(num_buckets), int(max_distance), int(bool(bidirectional))))


# ---- plans ----------------------------------------------------------------------------

class Plan:
    """One fmha_plan: a problem validated once, run many times on new tensors
    of its shapes and strides. The arrays the problem points at (masks,
    biases) must outlive the plan. Destroyed with this object, so a run that
    still holds it finishes before the C plan is freed."""

    __slots__ = ("handle", "problem", "_destroy", "_forward", "_backward")

    def __init__(self, problem):
        lib = load()
        handle = ctypes.c_void_p()
        check(lib.fmha_plan_create(ctypes.byref(problem), ctypes.byref(handle)), "fmha_plan_create")
        self.handle = handle.value
        self.problem = problem
        self._destroy = lib.fmha_plan_destroy
        self._forward = lib.fmha_plan_forward
        self._backward = lib.fmha_plan_backward

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle:
            self._destroy(handle)

    def forward(self, q, k, v, o, lse):
        """fmha_plan_forward on integer addresses (lse may be None); raises FmhaError."""
        st = self._forward(self.handle, q, k, v, o, lse)
        if st:
            check(st, "fmha_plan_forward")

    def backward(self, q, k, v, o, d_o, lse, dq, dk, dv, grads=None):
        """fmha_plan_backward; grads is an fmha_param_grads or None."""
        st = self._backward(self.handle, q, k, v, o, d_o, lse, dq, dk, dv,
                            ctypes.byref(grads) if grads is not None else None)
        if st:
            check(st, "fmha_plan_backward")

    def workspace_held(self):
        return int(load().fmha_plan_workspace_held(self.handle))

    def describe(self):
        """fmha_plan_describe: the driver, ISA, operand path, formats, tiles, threads and CPU."""
        lib = load()
        n = lib.fmha_plan_describe(self.handle, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.fmha_plan_describe(self.handle, buf, n + 1)
        return buf.value.decode()


class PlanCache:
    """Plans by key, least recently used evicted past `capacity` (0 keeps
    none). Thread-safe. An evicted plan is freed once no run holds it."""

    def __init__(self, capacity=32):
        self.capacity = int(capacity)
        self.hits = self.misses = 0
        self._plans = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, make_problem):
        """The plan of `key`, made from make_problem() on a miss."""
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return plan
            self.misses += 1
        plan = Plan(make_problem())
        evicted = []  # freed after the lock is released
        with self._lock:
            if self.capacity <= 0:
                return plan
            # Another thread may have made the same plan meanwhile: keep one.
            plan = self._plans.setdefault(key, plan)
            self._plans.move_to_end(key)
            while len(self._plans) > self.capacity:
                evicted.append(self._plans.popitem(last=False))
        del evicted
        return plan

    def __len__(self):
        with self._lock:
            return len(self._plans)

    def info(self):
        """dict(size, capacity, hits, misses)."""
        with self._lock:
            return dict(size=len(self._plans), capacity=self.capacity, hits=self.hits, misses=self.misses)

    def clear(self):
        with self._lock:
            plans, self._plans = self._plans, collections.OrderedDict()
            self.hits = self.misses = 0
        del plans
