"""``fgplugin bench``: the benchmark suites of BENCHMARKS.md (see :mod:`fgplugin.bench.cli`).

Imports neither PyG nor DGL at import time; the suites import them when they run.
"""
from .cli import SUITES, main

__all__ = ["main", "SUITES"]
