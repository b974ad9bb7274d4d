"""``fgplugin bench``: fgplugin's benchmark suites (epoch, accuracy, reorder, spmm, threshold,
scaling), run in-process from the installed package; see :mod:`fgplugin.bench.cli` and, for the
method, docs/benchmarks.md.

Imports neither PyG nor DGL at import time; the suites import them when they run.
"""
from .cli import SUITES, main

__all__ = ["main", "SUITES"]
