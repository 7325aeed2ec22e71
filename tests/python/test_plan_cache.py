"""test_plan_cache: the plans the bindings keep per shape (NumPy and torch:
fmha._lib.PlanCache; JAX: the FFI handlers' cache). Results through a
cached plan equal the one-shot C calls bitwise (same shape twice, another
shape, the first again), every cache stays within its bound, calls from
several Python threads are correct, and calls that name per-call arrays
stay correct. The JAX part is skipped without JAX, the torch part without
PyTorch (FMHA_REQUIRE_TORCH=1 makes that a failure)."""

import ctypes
import math
import os
import threading

import numpy as np
import pytest

import fmha
from fmha import _lib, api

from conftest import uniform

try:
    import jax
    import jax.numpy as jnp

    import fmha.jax as fj
except ImportError:
    jax = None

try:
    import torch

    import fmha.torch as ft
except ImportError:
    torch = None
    if os.environ.get("FMHA_REQUIRE_TORCH") == "1":
        raise

needs_jax = pytest.mark.skipif(jax is None, reason="JAX is not installed")
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (FMHA_REQUIRE_TORCH=1 makes "
                                                        "this a failure)")

# (B, T, S, N, K, H): the first appears again after the second
SHAPES = [(1, 16, 16, 4, 4, 16), (2, 9, 23, 4, 2, 8), (1, 16, 16, 4, 4, 16)]


def qkv(seed, B, T, S, N, K, H):
    rng = np.random.default_rng(seed)
    return uniform(rng, (B, T, N, H)), uniform(rng, (B, S, K, H)), uniform(rng, (B, S, K, H))


# ---- the one-shot C calls, as the NumPy binding made them before plans -------------------------

def one_shot(q, k, v, d_o=None, **kw):
    """fmha_forward (and fmha_backward with d_o) on the problem fmha.api
    describes for these arrays: (o, lse) or (o, lse, dq, dk, dv)."""
    bias, mask = kw.pop("bias", None), kw.pop("mask", None)
    call, q, k, v, _ = api._prepare(q, k, v, bias, mask, **dict(dict(
        scale=None, is_causal=False, causal_alignment="top_left", local_window_size=None,
        query_seq_lengths=None, key_value_seq_lengths=None, segment_ids=None, alibi_slopes=None,
        rel_table=None, rel_max_distance=128, rel_bidirectional=True, softcap=None, strategy="auto",
        mask_callback=None, bias_callback=None), **kw))
    B, T, N, S, K, H, Hv = call.shape
    api._describe(call, q, k, v)
    o = np.empty((B, T, N, Hv), q.dtype)
    lse = np.empty((B, N, T), np.float32)
    fptr = ctypes.POINTER(ctypes.c_float)
    addr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    lib = _lib.load()
    _lib.check(lib.fmha_forward(ctypes.byref(call.problem), addr(q), addr(k), addr(v), addr(o),
                                ctypes.cast(addr(lse), fptr), None, 0))
    if d_o is None:
        return o, lse
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _lib.check(lib.fmha_backward(ctypes.byref(call.problem), addr(q), addr(k), addr(v), addr(o), addr(d_o),
                                 ctypes.cast(addr(lse), fptr), addr(dq), addr(dk), addr(dv), None, None, 0))
    return o, lse, dq, dk, dv


def assert_bitwise(got, want):
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.tobytes() == w.tobytes()


# ---- PlanCache ------------------------------------------------------------------------------

def test_plan_cache_bound_and_lru_order():
    cache = _lib.PlanCache(3)
    problems = {S: _lib.problem_init(1, 1, 1, S, S, 8, 8) for S in range(1, 6)}
    for S in (1, 2, 3):
        cache.get(S, lambda S=S: problems[S])
    first = cache.get(1, lambda: pytest.fail("1 is cached"))
    cache.get(4, lambda: problems[4])  # evicts 2, the least recently used
    assert len(cache) == 3
    assert cache.get(1, lambda: pytest.fail("1 was used last")) is first
    cache.get(2, lambda: problems[2])
    assert cache.info() == dict(size=3, capacity=3, hits=2, misses=5)
    cache.clear()
    assert len(cache) == 0


def test_plan_cache_refuses_a_bad_problem():
    cache = _lib.PlanCache(4)
    p = _lib.problem_init(1, 3, 2, 4, 4, 8, 8)  # 3 query heads over 2 key heads
    with pytest.raises(fmha.FmhaError) as info:
        cache.get("bad", lambda: p)
    assert info.value.name == "FMHA_ERR_BAD_HEADS"
    assert len(cache) == 0


def test_plan_held_by_a_caller_outlives_eviction():
    cache = _lib.PlanCache(1)
    q, k, v = qkv(0, 1, 8, 8, 2, 2, 8)
    plan = cache.get("a", lambda: _lib.problem_init(1, 2, 2, 8, 8, 8, 8))
    cache.get("b", lambda: _lib.problem_init(1, 2, 2, 4, 4, 8, 8))  # evicts "a"
    assert len(cache) == 1
    o = np.empty_like(q)
    plan.forward(q.ctypes.data, k.ctypes.data, v.ctypes.data, o.ctypes.data, None)
    assert plan.workspace_held() > 0
    assert np.isfinite(o).all()


# ---- NumPy --------------------------------------------------------------------------------------

def test_numpy_cached_results_equal_one_shot():
    api._PLANS.clear()
    for i, shape in enumerate(SHAPES):
        q, k, v = qkv(i, *shape)
        d_o = uniform(np.random.default_rng(10 + i), q.shape[:3] + v.shape[3:])
        want = one_shot(q, k, v, d_o)
        for _ in range(2):
            o, lse = fmha.attention(q, k, v, return_lse=True)
            dq, dk, dv = fmha.attention_backward(q, k, v, o, lse, d_o)
            assert_bitwise((o, lse, dq, dk, dv), want)
    info = api._PLANS.info()
    assert info["size"] == 2  # the third shape is the first again
    assert info["misses"] == 2


def test_numpy_options_are_part_of_the_key():
    api._PLANS.clear()
    q, k, v = qkv(3, 1, 12, 12, 2, 2, 8)
    for kw in (dict(is_causal=True), dict(local_window_size=(3, 1)), dict(softcap=5.0), dict(scale=0.3),
               dict(is_causal=True, causal_alignment="bottom_right"), dict(strategy="tiled"), {}):
        want = one_shot(q, k, v, **kw)
        for _ in range(2):
            assert_bitwise(fmha.attention(q, k, v, return_lse=True, **kw), want)
    assert api._PLANS.info()["misses"] == 7


def test_numpy_strided_inputs_get_their_own_plan():
    api._PLANS.clear()
    rng = np.random.default_rng(4)
    base = uniform(rng, (1, 4, 10, 8))  # [B, N, T, H]: a permuted view is [B, T, N, H]
    q = k = v = base.transpose(0, 2, 1, 3)
    want = one_shot(q, k, v)
    assert_bitwise(fmha.attention(q, k, v, return_lse=True), want)
    qc = np.ascontiguousarray(q)
    assert_bitwise(fmha.attention(qc, qc, qc, return_lse=True), one_shot(qc, qc, qc))
    assert api._PLANS.info()["misses"] == 2


def test_numpy_per_call_arrays_take_the_one_shot_path():
    api._PLANS.clear()
    q, k, v = qkv(5, 2, 8, 8, 2, 2, 8)
    lengths = np.array([8, 5], np.int32)
    mask = np.tril(np.ones((8, 8), bool))
    o, lse = fmha.attention(q, k, v, key_value_seq_lengths=lengths, mask=mask, return_lse=True)
    assert api._PLANS.info() == dict(size=0, capacity=api._PLANS.capacity, hits=0, misses=0)
    assert_bitwise((o, lse), one_shot(q, k, v, key_value_seq_lengths=lengths, mask=mask))


def test_numpy_cache_stays_bounded():
    api._PLANS.clear()
    cap = api._PLANS.capacity
    for S in range(1, cap + 9):
        q, k, v = qkv(S, 1, S, S, 1, 1, 8)
        assert_bitwise(fmha.attention(q, k, v, return_lse=True), one_shot(q, k, v))
        assert len(api._PLANS) <= cap
    assert api._PLANS.info()["size"] == cap
    assert api._PLANS.info()["misses"] == cap + 8


def run_threads(work, n):
    errors = []

    def body(i):
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_numpy_concurrent_calls():
    api._PLANS.clear()
    cases = [qkv(20 + i, *SHAPES[i % 2]) for i in range(4)]
    wants = [one_shot(*c) for c in cases]

    def work(i):
        for r in range(12):
            j = (i + r) % len(cases)
            assert_bitwise(fmha.attention(*cases[j], return_lse=True), wants[j])

    run_threads(work, 6)
    assert api._PLANS.info()["size"] == 2


def test_numpy_eviction_while_other_threads_run(monkeypatch):
    api._PLANS.clear()
    monkeypatch.setattr(api._PLANS, "capacity", 2)
    cases = [qkv(50 + S, 1, S, S, 2, 2, 16) for S in (24, 40, 56, 72)]  # more shapes than room
    wants = [one_shot(*c) for c in cases]

    def work(i):
        for r in range(16):
            j = (i + r) % len(cases)
            assert_bitwise(fmha.attention(*cases[j], return_lse=True), wants[j])

    run_threads(work, 4)
    assert len(api._PLANS) <= 2
    api._PLANS.clear()


# ---- JAX --------------------------------------------------------------------------------------

def jax_fwd_bwd(**kw):
    def run(q, k, v, d_o):
        o, vjp = jax.vjp(lambda q, k, v: fj.dot_product_attention(q, k, v, **kw), q, k, v)
        return o, vjp(d_o)

    return jax.jit(run)


@needs_jax
def test_jax_cached_results_equal_one_shot():
    fj.plan_cache_clear()
    for i, shape in enumerate(SHAPES):
        q, k, v = qkv(i, *shape)
        d_o = uniform(np.random.default_rng(10 + i), q.shape[:3] + v.shape[3:])
        o1, _, dq1, dk1, dv1 = one_shot(q, k, v, d_o)
        fn = jax_fwd_bwd()
        for _ in range(2):
            o, (dq, dk, dv) = fn(q, k, v, d_o)
            assert_bitwise((o, dq, dk, dv), (o1, dq1, dk1, dv1))
    info = fj.plan_cache_info()
    assert info["size"] == 2
    assert info["misses"] == 2  # forward and backward share a shape's plan
    assert info["hits"] == 10


@needs_jax
def test_jax_cache_stays_bounded():
    fj.plan_cache_clear()
    cap = fj.plan_cache_info()["capacity"]
    fn = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v))
    for S in range(1, cap + 6):
        q, k, v = qkv(S, 1, S, S, 1, 1, 8)
        assert_bitwise((fn(q, k, v),), one_shot(q, k, v)[:1])
        assert fj.plan_cache_info()["size"] <= cap
    assert fj.plan_cache_info()["size"] == cap
    q, k, v = qkv(1, 1, 1, 1, 1, 1, 8)  # the first shape was evicted: made again, still right
    assert_bitwise((fn(q, k, v),), one_shot(q, k, v)[:1])


@needs_jax
def test_jax_masks_that_move_and_masks_that_stay():
    fj.plan_cache_clear()
    q, k, v = qkv(7, 2, 8, 8, 2, 2, 8)
    mask = np.tril(np.ones((8, 8), bool))
    lengths = np.array([8, 3], np.int32)
    want = one_shot(q, k, v, key_value_seq_lengths=lengths)[0]
    want_masked = fmha.attention(q, k, v, mask=mask)
    fn = jax.jit(lambda q, k, v, n: fj.dot_product_attention(q, k, v, key_value_seq_lengths=n))
    const = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v, mask=jnp.asarray(mask)))
    for r in range(3):
        assert_bitwise((fn(q, k, v, jnp.asarray(lengths)),), (want,))  # a new lengths buffer each time
        assert_bitwise((const(q, k, v),), (want_masked,))
    other = np.array([2, 8], np.int32)
    assert_bitwise((fn(q, k, v, jnp.asarray(other)),), one_shot(q, k, v, key_value_seq_lengths=other)[:1])
    assert fj.plan_cache_info()["size"] <= fj.plan_cache_info()["capacity"]


@needs_jax
def test_jax_concurrent_calls():
    fj.plan_cache_clear()
    cases = [qkv(30 + i, *SHAPES[i % 2]) for i in range(4)]
    wants = [one_shot(*c)[0] for c in cases]
    fn = jax.jit(lambda q, k, v: fj.dot_product_attention(q, k, v))
    for c in cases:
        fn(*c)  # compiled before the threads start

    def work(i):
        for r in range(12):
            j = (i + r) % len(cases)
            assert_bitwise((fn(*cases[j]),), (wants[j],))

    run_threads(work, 6)
    assert fj.plan_cache_info()["size"] == 2


# ---- torch --------------------------------------------------------------------------------------

def torch_one_shot(q, k, v, d_o, attn_mask=None, is_causal=False):
    """fmha_forward and fmha_backward on the problem fmha.torch builds for
    these [B, H, L, E] tensors (contiguous: the layouts the op keeps)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)) if attn_mask is not None else None
    bias = m if m is not None and m.is_floating_point() else None
    mask = m if m is not None and not m.is_floating_point() else None
    o = torch.empty(q.shape[:3] + v.shape[3:])
    lse = torch.empty(q.shape[:3])
    causal = _lib.CAUSAL_TOP_LEFT if is_causal else _lib.CAUSAL_NONE
    no_arrays = (None,) * 7  # lengths, segment ids, alibi, rel_table, sinks
    spec = ft._Spec(bias, mask, *no_arrays, causal, scale, [-1, -1], 0.0, [128, 1], 1, 0.0, 0, 0)
    p = ft._problem(q, k, v, ft._seq_strides(o), spec)
    lib = _lib.load()
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
    fptr = lambda t: ctypes.cast(ptr(t), ctypes.POINTER(ctypes.c_float))  # noqa: E731
    _lib.check(lib.fmha_forward(ctypes.byref(p), ptr(q), ptr(k), ptr(v), ptr(o), fptr(lse), None, 0))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _lib.check(lib.fmha_backward(ctypes.byref(p), ptr(q), ptr(k), ptr(v), ptr(o), ptr(d_o), fptr(lse),
                                 ptr(dq), ptr(dk), ptr(dv), None, None, 0))
    return o, dq, dk, dv


def torch_case(seed, B, T, S, N, K, H):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(B, N, T, H, generator=gen) * 2 - 1
    k = torch.rand(B, K, S, H, generator=gen) * 2 - 1
    v = torch.rand(B, K, S, H, generator=gen) * 2 - 1
    d_o = torch.rand(B, N, T, H, generator=gen) * 2 - 1
    return q, k, v, d_o


def torch_fwd_bwd(q, k, v, d_o, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = ft.scaled_dot_product_attention(*leaves, enable_gqa=True, **kw)
    grads = torch.autograd.grad(out, leaves, d_o)
    return (out.detach(),) + tuple(grads)


def assert_torch_bitwise(got, want):
    assert_bitwise([t.numpy() for t in got], [t.numpy() for t in want])


@needs_torch
def test_torch_cached_results_equal_one_shot():
    ft._PLANS.clear()
    for i, shape in enumerate(SHAPES):
        case = torch_case(i, *shape)
        want = torch_one_shot(*case)
        for _ in range(2):
            assert_torch_bitwise(torch_fwd_bwd(*case), want)
    info = ft._PLANS.info()
    assert info["size"] == 2
    assert info["misses"] == 2  # forward and backward share a shape's plan


@needs_torch
def test_torch_masks_by_address():
    ft._PLANS.clear()
    q, k, v, d_o = torch_case(8, 2, 8, 8, 2, 2, 8)
    gen = torch.Generator().manual_seed(9)
    bias = torch.rand(1, 2, 8, 8, generator=gen)
    mask = torch.rand(8, 8, generator=gen) > 0.3
    for m in (bias, mask, bias, mask):
        want = torch_one_shot(q, k, v, d_o, attn_mask=m, is_causal=True)
        assert_torch_bitwise(torch_fwd_bwd(q, k, v, d_o, attn_mask=m, is_causal=True), want)
    assert ft._PLANS.info()["size"] == 2
    moved = bias.clone()  # same values elsewhere: a plan of its own, the same results
    assert_torch_bitwise(torch_fwd_bwd(q, k, v, d_o, attn_mask=moved, is_causal=True),
                         torch_one_shot(q, k, v, d_o, attn_mask=bias, is_causal=True))
    bias.mul_(2.0)  # new values at the same address: read at the run
    assert_torch_bitwise(torch_fwd_bwd(q, k, v, d_o, attn_mask=bias, is_causal=True),
                         torch_one_shot(q, k, v, d_o, attn_mask=bias, is_causal=True))


@needs_torch
def test_torch_cache_stays_bounded():
    ft._PLANS.clear()
    cap = ft._PLANS.capacity
    for S in range(1, cap + 6):
        q, k, v, d_o = torch_case(S, 1, S, S, 1, 1, 8)
        with torch.no_grad():
            out = ft.scaled_dot_product_attention(q, k, v)
        assert_torch_bitwise((out,), torch_one_shot(q, k, v, d_o)[:1])
        assert len(ft._PLANS) <= cap
    assert ft._PLANS.info()["size"] == cap


@needs_torch
def test_torch_concurrent_calls():
    ft._PLANS.clear()
    cases = [torch_case(40 + i, *SHAPES[i % 2]) for i in range(4)]
    wants = [torch_one_shot(*c) for c in cases]

    def work(i):
        for r in range(8):
            j = (i + r) % len(cases)
            assert_torch_bitwise(torch_fwd_bwd(*cases[j]), wants[j])

    run_threads(work, 6)
    assert ft._PLANS.info()["size"] == 2
