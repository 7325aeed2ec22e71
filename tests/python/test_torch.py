"""test_torch: fmha.torch.scaled_dot_product_attention (torch.library custom
op) against torch.nn.functional.scaled_dot_product_attention: outputs and
gradients (query, key, value, float attn_mask), GQA, causal, boolean masks,
strided inputs, torch.compile and opcheck. Skipped when PyTorch is not
installed, unless FMHA_REQUIRE_TORCH=1. `import fmha` without PyTorch is
checked either way."""

import os
import subprocess
import sys

import numpy as np
import pytest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")


def test_import_fmha_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import fmha, fmha.api\n"
            "try:\n    import fmha.torch\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ImportError: fmha.torch needs PyTorch" in proc.stdout


try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

if torch is None:
    if os.environ.get("FMHA_REQUIRE_TORCH") == "1":
        raise RuntimeError("FMHA_REQUIRE_TORCH=1 but PyTorch is not importable")
    FT = None
else:
    import fmha.torch as FT

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed (FMHA_REQUIRE_TORCH=1 makes "
                                                        "this a failure)")

from conftest import rel_error, require  # noqa: E402

TOL = 2e-5


def rnd(gen, *shape):
    return torch.rand(*shape, generator=gen) * 2 - 1


def run(fn, q, k, v, d_o, mask=None, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    m = mask
    if mask is not None and mask.is_floating_point():
        m = mask.detach().clone().requires_grad_()
        leaves.append(m)
    out = fn(*leaves[:3], attn_mask=m, **kw)
    (out * d_o).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def compare(q, k, v, mask=None, **kw):
    gen = torch.Generator().manual_seed(q.numel())
    d_o = rnd(gen, *(q.shape[:-1] + v.shape[-1:]))
    ours = run(FT.scaled_dot_product_attention, q, k, v, d_o, mask, **kw)
    theirs = run(F.scaled_dot_product_attention, q, k, v, d_o, mask, **kw)
    assert rel_error(ours[0].numpy(), theirs[0].numpy()) < TOL
    for a, b in zip(ours[1], theirs[1]):
        assert a.shape == b.shape
        assert rel_error(a.float().numpy(), b.float().numpy()) < TOL


SHAPES = [(1, 2, 2, 8, 8, 8), (2, 4, 4, 13, 21, 16), (2, 6, 2, 33, 17, 24), (1, 4, 1, 7, 40, 8)]


@needs_torch
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_matches_pytorch(shape, is_causal):
    B, H, Hkv, L, S, E = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q, k, v = rnd(gen, B, H, L, E), rnd(gen, B, Hkv, S, E), rnd(gen, B, Hkv, S, E)
    compare(q, k, v, is_causal=is_causal, enable_gqa=H != Hkv)


@needs_torch
def test_scale_three_d_and_strided_inputs():
    gen = torch.Generator().manual_seed(1)
    q, k, v = rnd(gen, 2, 9, 8), rnd(gen, 2, 11, 8), rnd(gen, 2, 11, 8)
    compare(q, k, v, scale=0.3)
    bshd = rnd(gen, 2, 11, 4, 8)                # [B, S, H, E] memory, viewed as [B, H, S, E]
    compare(bshd.transpose(1, 2), bshd.transpose(1, 2), rnd(gen, 2, 4, 11, 8))


@needs_torch
@pytest.mark.parametrize("mask_shape", [(2, 4, 10, 12), (1, 1, 10, 12), (10, 12), (2, 1, 1, 12)])
def test_float_mask_and_its_gradient(mask_shape):
    require("bias")
    gen = torch.Generator().manual_seed(len(mask_shape))
    q, k, v = rnd(gen, 2, 4, 10, 8), rnd(gen, 2, 4, 12, 8), rnd(gen, 2, 4, 12, 8)
    compare(q, k, v, mask=rnd(gen, *mask_shape))


@needs_torch
def test_bool_mask():
    require("mask")
    gen = torch.Generator().manual_seed(2)
    q, k, v = rnd(gen, 2, 4, 10, 8), rnd(gen, 2, 4, 12, 8), rnd(gen, 2, 4, 12, 8)
    mask = torch.rand(2, 1, 10, 12, generator=gen) > 0.3
    mask[..., 0] = True
    compare(q, k, v, mask=mask)


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_dtypes(dtype):
    require(dtype)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (rnd(gen, 1, 4, 16, 16).to(dt) for _ in range(3))
    out = FT.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert out.dtype == dt
    assert rel_error(out.float().numpy(), want.numpy()) < 2e-2


# The ops' schemas as callers know them (argument names, types, order).
ATTENTION_SCHEMA = (
    "fmha::attention(Tensor q, Tensor k, Tensor v, Tensor? bias, Tensor? mask, Tensor? q_lengths, Tensor? kv_lengths, "
    "Tensor? q_ids, Tensor? kv_ids, Tensor? alibi, Tensor? rel_table, Tensor? sinks, SymInt causal, float scale, "
    "SymInt[] window, float softcap, SymInt[] rel_options, SymInt precision, float dropout_p, SymInt dropout_seed, "
    "SymInt dropout_offset, Tensor? block_table=None) -> (Tensor, Tensor)")
BACKWARD_SCHEMA = (
    "fmha::attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor d_o, Tensor? bias, "
    "Tensor? mask, Tensor? q_lengths, Tensor? kv_lengths, Tensor? q_ids, Tensor? kv_ids, Tensor? alibi, "
    "Tensor? rel_table, Tensor? sinks, SymInt causal, float scale, SymInt[] window, float softcap, "
    "SymInt[] rel_options, SymInt precision, float dropout_p, SymInt dropout_seed, SymInt dropout_offset, "
    "bool[] wanted) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")


@needs_torch
def test_op_schemas_and_named_arguments():
    from fmha import _torch_core as core

    assert str(torch.ops.fmha.attention.default._schema) == ATTENTION_SCHEMA
    assert str(torch.ops.fmha.attention_backward.default._schema) == BACKWARD_SCHEMA
    for op, fields in ((torch.ops.fmha.attention.default, core.AttentionArgs._fields),
                       (torch.ops.fmha.attention_backward.default, core.BackwardArgs._fields)):
        assert [a.name for a in op._schema.arguments] == list(fields)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (rnd(gen, 1, 2, 8, 8) for _ in range(3))
    options = dict(causal=1, scale=0.25, window=[-1, -1], softcap=0.0, rel_options=[128, 1], precision=1,
                   dropout_p=0.0, dropout_seed=0, dropout_offset=0)
    named = torch.ops.fmha.attention(*core.attention_args(q, k, v, **options))
    positional = torch.ops.fmha.attention(q, k, v, *(None,) * 9, *options.values())
    assert all(torch.equal(a, b) for a, b in zip(named, positional))
    o, lse = named
    d_o = rnd(gen, 1, 2, 8, 8)
    named = torch.ops.fmha.attention_backward(*core.backward_args(q, k, v, o, lse, d_o, wanted=[False] * 4,
                                                                  **options))
    positional = torch.ops.fmha.attention_backward(q, k, v, o, lse, d_o, *(None,) * 9, *options.values(),
                                                   [False] * 4)
    assert all(torch.equal(a, b) for a, b in zip(named, positional))


@needs_torch
def test_compile_and_opcheck():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (rnd(gen, 1, 2, 8, 8) for _ in range(3))
    no_arrays = (None,) * 9  # bias, mask, lengths, segment ids, alibi, rel_table, sinks
    torch.library.opcheck(torch.ops.fmha.attention.default,
                          (q, k, v, *no_arrays, 1, 0.25, [-1, -1], 0.0, [128, 1], 1, 0.0, 0, 0))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    f = torch.compile(lambda q, k, v: FT.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum(),
                      backend="aot_eager", fullgraph=True)
    f(*leaves).backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True).square().sum().backward()
    for a, b in zip(leaves, ref):
        assert rel_error(a.grad.numpy(), b.grad.numpy()) < TOL


@needs_torch
def test_eager_calls_match_the_op_and_modes_see_the_op():
    """Eager calls run the op's kernel and autograd pair without the
    dispatcher: the same bits as the op (forward and gradients, with a
    float mask's gradient too); under a dispatch mode the call goes through
    the op, which the mode sees; a second derivative is refused."""
    from torch.utils._python_dispatch import TorchDispatchMode

    gen = torch.Generator().manual_seed(11)
    q, k, v = rnd(gen, 2, 4, 9, 8), rnd(gen, 2, 2, 13, 8), rnd(gen, 2, 2, 13, 8)
    bias = rnd(gen, 2, 1, 9, 13)
    d_o = rnd(gen, 2, 4, 9, 8)
    eager = run(FT.scaled_dot_product_attention, q, k, v, d_o, bias, is_causal=True, enable_gqa=True)
    run_attention = FT._attention
    FT._attention = lambda *args: torch.ops.fmha.attention(*args)[0]  # every call through the dispatcher
    try:
        via_op = run(FT.scaled_dot_product_attention, q, k, v, d_o, bias, is_causal=True, enable_gqa=True)
    finally:
        FT._attention = run_attention
    assert torch.equal(eager[0], via_op[0])
    for a, b in zip(eager[1], via_op[1]):
        assert torch.equal(a, b)

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as mode, torch.no_grad():
        out = FT.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert any("fmha.attention" in name for name in mode.ops), mode.ops
    assert torch.equal(out, FT.scaled_dot_product_attention(q, k, v, enable_gqa=True))

    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = FT.scaled_dot_product_attention(*leaves, enable_gqa=True)
    (g,) = torch.autograd.grad(out.square().sum(), leaves[:1], create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), leaves[:1])
    # a constant upstream gradient (out.sum()) too: a gradient penalty raises
    # rather than dropping its second-order term
    out = FT.scaled_dot_product_attention(*leaves, enable_gqa=True)
    (g,) = torch.autograd.grad(out.sum(), leaves[:1], create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        (out.sum() + g.square().sum()).backward()


@needs_torch
@pytest.mark.parametrize("case", ["plain", "bool_mask", "permuted", "strided_grad", "broadcast_kv", "q_only"])
def test_eager_backward_through_the_forward_plan(case):
    """The eager backward runs on the forward's plan when its operands share
    the forward's layouts (else the general backward): gradients bitwise
    equal to the op's through the dispatcher, for contiguous, permuted
    ([B, L, H, E] viewed as [B, H, L, E]) and broadcast inputs, a d_o of
    other strides, a boolean mask and a gradient wanted for q alone."""
    gen = torch.Generator().manual_seed(5)
    B, H, L, S, E = 2, 4, 11, 19, 8
    q, k, v = rnd(gen, B, H, L, E), rnd(gen, B, H, S, E), rnd(gen, B, H, S, E)
    d_o = rnd(gen, B, H, L, E)
    kw = {}
    if case == "permuted":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if case == "strided_grad":
        d_o = rnd(gen, B, L, H, E).transpose(1, 2)
    if case == "broadcast_kv":
        k, v = k[:, :1].expand(B, H, S, E), v[:, :1].expand(B, H, S, E)
    if case == "bool_mask":
        kw["attn_mask"] = torch.rand(B, 1, L, S, generator=gen) > 0.3

    def grads(attention):
        wanted = (True, case != "q_only", case != "q_only")
        leaves = [t.detach().requires_grad_(w) for t, w in zip((q, k, v), wanted)]
        out = FT.scaled_dot_product_attention(*leaves, is_causal=case == "plain", **kw)
        inputs = [t for t in leaves if t.requires_grad]
        return out.detach(), torch.autograd.grad(out, inputs, d_o)

    eager = grads(FT._attention)
    run_attention = FT._attention
    FT._attention = lambda *args: torch.ops.fmha.attention(*args)[0]  # every call through the dispatcher
    try:
        via_op = grads(FT._attention)
    finally:
        FT._attention = run_attention
    assert torch.equal(eager[0], via_op[0])
    assert len(eager[1]) == len(via_op[1])
    for a, b in zip(eager[1], via_op[1]):
        assert a.shape == b.shape and torch.equal(a, b)


@needs_torch
def test_errors():
    gen = torch.Generator().manual_seed(5)
    q, k, v = rnd(gen, 1, 4, 8, 8), rnd(gen, 1, 2, 8, 8), rnd(gen, 1, 2, 8, 8)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        FT.scaled_dot_product_attention(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="enable_gqa"):
        FT.scaled_dot_product_attention(q, k, v)
    with pytest.raises(TypeError):
        FT.scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(TypeError):
        FT.scaled_dot_product_attention(q, q.half(), q)
    with pytest.raises(ValueError):
        FT.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(3, 8, 8))
    with pytest.raises(FT.FmhaError, match="FMHA_ERR_BAD_HEAD_DIM"):
        big = rnd(gen, 1, 1, 4, 600)
        FT.scaled_dot_product_attention(big, big, big)
    assert np.isfinite(FT.scaled_dot_product_attention(q, k, v, enable_gqa=True).numpy()).all()


# A float32 call that names no precision takes torch's float32 matmul
# precision: 'high' as bf16x3, 'medium' as bf16, 'highest' as fast.
@needs_torch
@pytest.mark.parametrize("setting, precision", [("high", "bf16x3"), ("medium", "bf16"), ("highest", "fast")])
def test_float32_matmul_precision_picks_the_precision(setting, precision):
    g = torch.Generator().manual_seed(4)
    q, k, v = (rnd(g, 1, 2, 200, 32) for _ in range(3))
    named = FT.scaled_dot_product_attention(q, k, v, is_causal=True, precision=precision)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(setting)
        taken = FT.scaled_dot_product_attention(q, k, v, is_causal=True)
    finally:
        torch.set_float32_matmul_precision(old)
    assert torch.equal(taken, named)
