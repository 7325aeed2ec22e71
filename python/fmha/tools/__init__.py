"""fmha.tools: the benchmark and report tools, kept out of the runtime
package (the bindings never import them).

    python -m fmha.tools.bench_peers   JAX and PyTorch peers beside fmha's
                                       bindings, rows added to fmha-bench's
                                       results file
    python -m fmha.tools.report        report/README.md and PNG charts from
                                       results files (needs matplotlib)

python -m fmha.bench_peers and python -m fmha.report still run them.
"""
