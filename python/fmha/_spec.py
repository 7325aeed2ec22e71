"""_spec: the codes and names the bindings and the JAX FFI handler agree on.

This is the bottom of the Python package: plain constants, no imports. It
holds the bindings' causal codes, the optional operands of the FFI calls
(the `extras` bit set) and of the backward's parameter gradients (the
`grads` bit set), the FFI targets and their attributes in order.
_ffi/fmha_jax_ffi.c carries the same values in C;
tests/python/test_spec.py reads them out of that file and compares.
"""

# ---- causal codes --------------------------------------------------------------------

# The bindings' causal code: fmha_causal's values (fmha.h), then one more
# for no causal mask with bottom-right alignment (fmha_problem.alignment) of
# windows and position biases, as FlashAttention measures them.
CAUSAL_NONE = 0
CAUSAL_TOP_LEFT = 1
CAUSAL_BOTTOM_RIGHT = 2
CAUSAL_NONE_BOTTOM_RIGHT = 3

# ---- the FFI calls (fmha.jax and _ffi/fmha_jax_ffi.c) -------------------------------

# XLA custom-call target -> the symbol of its handler in the FFI library.
FFI_TARGETS = {"fmha_forward": "fmha_ffi_forward", "fmha_backward": "fmha_ffi_backward"}

# The optional operands, in the order the handlers read them after the
# tensors: (name in fmha.jax, the handler's ExtraBits enumerator). The
# operand at position i has bit 1 << i in the `extras` attribute.
EXTRAS = (("bias", "kBias"), ("mask", "kMask"), ("q_lens", "kQLengths"), ("kv_lens", "kKvLengths"),
          ("q_seg", "kQSegments"), ("kv_seg", "kKvSegments"), ("alibi", "kAlibi"), ("rel", "kRelTable"),
          ("sinks", "kSinks"), ("dropout_seed", "kDropoutSeed"), ("block_table", "kBlockTable"))
EXTRA_NAMES = tuple(name for name, _ in EXTRAS)
EXTRA_BITS = {name: 1 << i for i, name in enumerate(EXTRA_NAMES)}

# The differentiable float parameters, in the order of the backward's extra
# results: (name in fmha.jax, the handler's GradBits enumerator); bit 1 << i
# in the `grads` attribute.
GRADS = (("bias", "kGradBias"), ("alibi", "kGradAlibi"), ("rel", "kGradRelTable"), ("sinks", "kGradSinks"))
GRAD_NAMES = tuple(name for name, _ in GRADS)
GRAD_BITS = {name: 1 << i for i, name in enumerate(GRAD_NAMES)}

# The handlers' attributes in the order of their tables (kForwardAttrs,
# then kBackwardOnlyAttrs): (name, kind), kind "f32" (float) or "i64"
# (int64_t). `causal` is a causal code above, `extras` and
# `grads` the bit sets above, the window's sides -1 when unbounded.
FFI_ATTRS = (("scale", "f32"), ("causal", "i64"), ("window_left", "i64"), ("window_right", "i64"),
             ("strategy", "i64"), ("extras", "i64"), ("softcap", "f32"), ("precision", "i64"),
             ("rel_max_distance", "i64"), ("rel_bidirectional", "i64"), ("dropout_p", "f32"))
FFI_BACKWARD_ATTRS = FFI_ATTRS + (("grads", "i64"),)

# Argument ranges every binding applies alike (NumPy, JAX, torch).
# dropout_seed and dropout_offset are uint64 in the C problem: [0, 2**64).
DROPOUT_COUNTER_LIMIT = 2**64
# Index arrays (lengths, segment ids, block tables) are int32 in the C
# problem: values outside int32 are an error, never a wrap.
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# Quantized KV-cache formats (fmha_kv_format): name -> (code, kind of scales,
# values per block, bytes per block). Scales: "key" one float32 per (key, kv
# head) [B, S, K] (page pools [P, page, K]); "head" one per kv head [K]
# (optional, 1 when absent); None inside the blocks.
KV_FORMATS = {
    "int8": (4, "key", 1, 1),
    "fp8_e4m3": (5, "head", 1, 1),
    "fp8_e5m2": (6, "head", 1, 1),
    "q8_0": (7, None, 32, 34),
    "q4_0": (8, None, 32, 18),
}
KV_FORMAT_TOP = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}  # largest finite value


def kv_format_head_dim(fmt, last):
    """The head dim a stored row of `last` units holds in format fmt, or None
    when `last` is not a whole number of blocks."""
    _, _, per, nbytes = KV_FORMATS[fmt]
    return last // nbytes * per if last % nbytes == 0 else None
