"""The checked-in Python API reference (docs/api/python.md) is what
scripts/gen_api_docs.py makes from the sources today: a changed signature or
docstring without a regenerated page fails here."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_api_reference_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_api_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_python_api_reference_lists_every_public_name():
    text = (ROOT / "docs" / "api" / "python.md").read_text()
    for name in ("fmha.attention(", "fmha.attention_backward(", "fmha.merge(", "class `fmha.FmhaError`",
                 "class `fmha.FmhaArgumentError`", "fmha.jax.dot_product_attention(", "fmha.flax.dot_product_attention(",
                 "fmha.torch.scaled_dot_product_attention(", "fmha.torch.flex_attention("):
        assert name in text, name
