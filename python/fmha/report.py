"""fmha.report: the former name of fmha.tools.report, kept so that
`python -m fmha.report` and `from fmha import report` still work; both
reach the tool's module."""

import sys

from .tools import report as _tool


def __getattr__(name):
    return getattr(_tool, name)


if __name__ == "__main__":
    sys.exit(_tool.main())
