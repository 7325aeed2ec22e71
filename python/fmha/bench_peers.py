"""fmha.bench_peers: the former name of fmha.tools.bench_peers, kept so that
`python -m fmha.bench_peers` and `from fmha import bench_peers` still work;
both reach the tool's module."""

import sys

from .tools import bench_peers as _tool


def __getattr__(name):
    return getattr(_tool, name)


if __name__ == "__main__":
    sys.exit(_tool.main())
