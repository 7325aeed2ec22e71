"""test_spec: the JAX FFI handler (python/fmha/_ffi/fmha_jax_ffi.c) and
the bindings agree on what python/fmha/_spec.py holds: the `extras` and
`grads` bits with the order the handler reads their operands and results
in, the causal codes (fmha.h's fmha_causal and the bindings' extra one),
the FFI targets' symbols and their attributes in the order of the
handler's tables. The C is read as text; neither JAX nor a compiler is
needed."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANDLER = ROOT / "python" / "fmha" / "_ffi" / "fmha_jax_ffi.c"
HEADER = ROOT / "include" / "fmha.h"


def load_spec():
    """_spec by its path: it imports nothing, and fmha's __init__ is not needed."""
    spec = importlib.util.spec_from_file_location("fmha_spec_under_test", ROOT / "python" / "fmha" / "_spec.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = load_spec()
SOURCE = HANDLER.read_text()


def enum_values(name):
    """The enumerators of the C `enum name` as (enumerator, value) pairs, in order."""
    m = re.search(rf"enum {name}\b[^{{]*\{{([^}}]*)\}}", SOURCE)
    assert m, f"enum {name} not found in {HANDLER.name}"
    return [(k, int(v)) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", m.group(1))]


def table_rows(start):
    """The leading enumerators of the rows of the brace table that follows `start`."""
    at = SOURCE.index(start)
    body = SOURCE[at:SOURCE.index("};", at)]
    return re.findall(r"\{\s*(k\w+)\s*,", body)


def test_extras_bits_and_operand_order():
    assert enum_values("ExtraBits") == [(cpp, 1 << i) for i, (_, cpp) in enumerate(SPEC.EXTRAS)]
    # ReadExtras takes the operands in this order
    assert table_rows("} kinds[] = {") == [cpp for _, cpp in SPEC.EXTRAS]
    assert SPEC.EXTRA_BITS == {name: 1 << i for i, (name, _) in enumerate(SPEC.EXTRAS)}
    assert len(set(SPEC.EXTRA_NAMES)) == len(SPEC.EXTRA_NAMES)


def test_grad_bits_and_result_order():
    assert enum_values("GradBits") == [(cpp, 1 << i) for i, (_, cpp) in enumerate(SPEC.GRADS)]
    # the backward's parameter gradients come in this order
    assert table_rows("} wanted[] = {") == [cpp for _, cpp in SPEC.GRADS]
    assert set(SPEC.GRAD_NAMES) <= set(SPEC.EXTRA_NAMES)


def test_causal_codes():
    m = re.search(r"enum fmha_causal\s*\{([^}]*)\}\s*fmha_causal\s*;", HEADER.read_text())
    assert m, "fmha_causal not found in fmha.h"
    names = re.findall(r"FMHA_CAUSAL_(\w+)", m.group(1))
    assert names == ["NONE", "TOP_LEFT", "BOTTOM_RIGHT"] and "= 0" in m.group(1) and m.group(1).count("=") == 1
    assert [SPEC.CAUSAL_NONE, SPEC.CAUSAL_TOP_LEFT, SPEC.CAUSAL_BOTTOM_RIGHT] == [0, 1, 2]
    m = re.search(r"enum \{ kCausalNoneBottomRight = (\d+) \};", SOURCE)
    assert m and int(m.group(1)) == SPEC.CAUSAL_NONE_BOTTOM_RIGHT
    assert SPEC.CAUSAL_NONE_BOTTOM_RIGHT not in (0, 1, 2)
    # the handler names it, no literal code beside it
    assert not re.search(r"causal\s*==\s*\d", SOURCE)


def attr_table(table):
    """The rows {"name", ATTR_KIND, ...} of the handler's attribute table `table`, as (name, kind)."""
    at = SOURCE.index(f"static const attr_spec {table}[] = {{")
    body = SOURCE[at:SOURCE.index("};", at)]
    kinds = {"ATTR_F32": "f32", "ATTR_I64": "i64"}
    return [(name, kinds[k]) for name, k in re.findall(r'\{"(\w+)", (ATTR_\w+),', body)]


def test_targets_and_attributes():
    assert set(SPEC.FFI_TARGETS) == {"fmha_forward", "fmha_backward"}
    for symbol in SPEC.FFI_TARGETS.values():
        assert re.search(rf'FMHA_FFI_EXPORT XLA_FFI_Error \*{symbol}\(XLA_FFI_CallFrame \*cf\) \{{', SOURCE)
    # the forward reads kForwardAttrs, the backward those and kBackwardOnlyAttrs (start_call's flag)
    assert attr_table("kForwardAttrs") == list(SPEC.FFI_ATTRS)
    assert attr_table("kForwardAttrs") + attr_table("kBackwardOnlyAttrs") == list(SPEC.FFI_BACKWARD_ATTRS)
    for symbol, backward in ((SPEC.FFI_TARGETS["fmha_forward"], "false"), (SPEC.FFI_TARGETS["fmha_backward"], "true")):
        body = SOURCE[SOURCE.index(f"{symbol}(XLA_FFI_CallFrame *cf) {{"):]
        body = body[:body.index("\n}\n")]
        assert f"start_call(cf, {backward}, &c, " in body


def test_lib_uses_the_spec_codes():
    import fmha._lib as lib  # no libfmha needed to import it

    assert (lib.CAUSAL_NONE, lib.CAUSAL_TOP_LEFT, lib.CAUSAL_BOTTOM_RIGHT, lib.CAUSAL_NONE_BOTTOM_RIGHT) == (
        SPEC.CAUSAL_NONE, SPEC.CAUSAL_TOP_LEFT, SPEC.CAUSAL_BOTTOM_RIGHT, SPEC.CAUSAL_NONE_BOTTOM_RIGHT)
