"""Points the vendored upstream tests (see README.md) at fgplugin's layers and records what ran.

Loaded by pytest before it imports any vendored test module, so the modules' own imports
(``from torch_geometric.nn import GCNConv``, ``import dgl.nn.pytorch as nn``) already resolve to
fgplugin's classes. Nothing here changes what a test checks: the layers are swapped with
``fgplugin.pyg.patch()`` / ``fgplugin.dgl.patch()`` only.

Runs in its own process (tests/test_upstream_suites.py starts it; the main test run ignores this
folder, since patching is process-global): ``python -m pytest tests/upstream/<pyg|dgl>
--confcutdir tests/upstream -p no:cacheprovider``. With ``FGPLUGIN_UPSTREAM_REPORT=<path>`` it
writes a JSON summary at the end: outcome counts, the reason of every skip, the failures, and how
often fgplugin's SpMM ran (in all and per test), which shows that the tests ran our kernels
rather than the stock code.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

import fgplugin
import fgplugin.ops

HERE = Path(__file__).resolve().parent
REPORT_ENV = "FGPLUGIN_UPSTREAM_REPORT"

# ------------------------------------------------------------------ SpMM call counting
SPMM_CALLS = Counter()  # node id -> calls of fgplugin.spmm while that test ran ("" outside tests)
_current_test = [""]


def _counting(spmm):
    @functools.wraps(spmm)
    def counted(*args, **kwargs):
        SPMM_CALLS[_current_test[0]] += 1
        return spmm(*args, **kwargs)

    counted.__wrapped_by_upstream_conftest__ = True
    return counted


# The adapters call ``fgplugin.spmm`` (an attribute lookup at call time); ``fgplugin.ops.spmm`` is
# the same function under its defining module. Both are wrapped, once.
if not getattr(fgplugin.spmm, "__wrapped_by_upstream_conftest__", False):
    fgplugin.ops.spmm = fgplugin.spmm = _counting(fgplugin.ops.spmm)

# ------------------------------------------------------------------ patching
PATCHED: dict[str, dict[str, str]] = {}  # framework -> stock name -> class it resolves to


def _qualname(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _patch_pyg() -> None:
    import torch_geometric.nn.conv  # noqa: F401  (imports torch_geometric.nn too)

    import fgplugin.pyg as fpyg

    fpyg.patch()
    names = {}
    for stock, ours in fpyg.LAYERS.items():
        name = stock.__name__
        for path in ("torch_geometric.nn", "torch_geometric.nn.conv"):
            resolved = getattr(sys.modules[path], name)
            assert resolved is ours, f"{path}.{name} is {resolved}, not fgplugin's {ours}"
            names[f"{path}.{name}"] = _qualname(resolved)
    PATCHED["pyg"] = names


def _patch_dgl() -> None:
    from fgplugin.dgl._import_shim import import_dgl

    import_dgl()  # DGL 2.1 under this torch only imports through the shim
    import dgl.nn.pytorch.conv  # noqa: F401  (imports dgl.nn and dgl.nn.pytorch too)

    import fgplugin.dgl as fdgl

    fdgl.patch()
    names = {}
    for stock, ours in fdgl.LAYERS.items():
        name = stock.__name__
        # (dgl.nn copies dgl.nn.pytorch's namespace, __name__ included: name the modules by path)
        for path in ("dgl.nn", "dgl.nn.pytorch", "dgl.nn.pytorch.conv"):
            resolved = getattr(sys.modules[path], name)
            assert resolved is ours, f"{path}.{name} is {resolved}, not fgplugin's {ours}"
            names[f"{path}.{name}"] = _qualname(resolved)
    PATCHED["dgl"] = names
    # DGL's tests import their helpers as top-level `backend` and `utils` (DGL runs them with
    # PYTHONPATH=tests); ours lie next to the vendored test_nn.py.
    for helper in ("backend", "utils"):
        loaded = sys.modules.get(helper)
        assert loaded is None or Path(loaded.__file__).resolve().parent.parent == HERE / "dgl", \
            f"a module named {helper!r} from {getattr(loaded, '__file__', '?')} shadows DGL's test helpers"
    sys.path.insert(0, str(HERE / "dgl"))
    os.environ.setdefault("DGLTESTDEV", "cpu")


_SUITES: list[str] = []


def pytest_configure(config):
    """Patches the frameworks whose suites this run collects (the folders named on the command
    line; both when none is). pytest calls this as it loads this file, before collection."""
    args = [str(Path(arg.split("::")[0]).resolve()) for arg in config.args]
    suites = [fw for fw in ("pyg", "dgl") if any(arg.startswith(str(HERE / fw)) for arg in args)]
    for framework in suites or ["pyg", "dgl"]:
        if framework not in _SUITES:
            {"pyg": _patch_pyg, "dgl": _patch_dgl}[framework]()
            _SUITES.append(framework)


# Upstream tests that fail against fgplugin's layers for a behaviour difference that README.md
# ("Skips and known differences") describes; the project notes hold the diagnosis and a proposed
# fix. They still run, marked xfail (not strict: whether they fail depends on the random inputs),
# so that nothing else may fail; remove an entry once the adapter is fixed. Keys: node ids below
# this folder; values: (reason, whether it applies in this run).
_FULL_TEST = os.environ.get("FULL_TEST", "0") == "1"
_ROUNDING = ("fgplugin's SpMM rounds differently from PyG's scatter-based propagate (|diff| ~ 2e-7); "
             "this test compares an fgplugin-served call with a stock-served one ({}) at "
             "{}; see tests/upstream/README.md, 'Skips and known differences'")
KNOWN_DIFFERENCES = {
    "pyg/test_sg_conv.py::test_sg_conv": (
        _ROUNDING.format("TorchScript runs the stock code", "exact equality (.tolist() ==)"),
        _FULL_TEST),  # the comparison is inside `if is_full_test():`
}


def pytest_collection_modifyitems(session, config, items):
    """Marks the known differences; checks that every vendored module that bound a stock layer
    name at import holds fgplugin's class."""
    for item in items:
        rel = Path(item.path).resolve().relative_to(HERE).as_posix() + "::" + item.name.split("[")[0]
        reason, applies = KNOWN_DIFFERENCES.get(rel, (None, False))
        if applies:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=False))
    ours = {}
    if "pyg" in PATCHED:
        import fgplugin.pyg as fpyg

        ours.update({cls.__name__: cls for cls in fpyg.LAYERS.values()})
    for module in {item.module for item in items if getattr(item, "module", None) is not None}:
        for name, cls in ours.items():
            if name in vars(module):
                assert vars(module)[name] is cls, f"{module.__name__}.{name} is not fgplugin's layer"
    if "dgl" in PATCHED:
        import dgl.nn.pytorch
        import fgplugin.dgl as fdgl

        for cls in fdgl.LAYERS.values():
            assert getattr(dgl.nn.pytorch, cls.__name__) is cls


# ------------------------------------------------------------------ outcome summary
OUTCOMES = Counter()
SKIPS: list[dict] = []
FAILURES: list[dict] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _current_test[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current_test[0] = ""


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed) or \
            (report.when == "teardown" and report.failed):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed and report.when != "call":
            outcome = "error"
        else:
            outcome = report.outcome
        OUTCOMES[outcome] += 1
        if outcome == "skipped":
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            SKIPS.append({"test": report.nodeid, "reason": reason})
        elif outcome in ("failed", "error"):
            FAILURES.append({"test": report.nodeid, "when": report.when,
                             "message": str(getattr(report.longrepr, "reprcrash", report.longrepr))})


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    per_test = {k: v for k, v in sorted(SPMM_CALLS.items()) if k}
    summary = {
        "suites": _SUITES,
        "exitstatus": int(exitstatus),
        "outcomes": dict(OUTCOMES),
        "skips": SKIPS,
        "failures": FAILURES,
        "spmm_calls": sum(SPMM_CALLS.values()),
        "tests_reaching_spmm": len(per_test),
        "spmm_calls_per_test": per_test,
        "patched": PATCHED,
    }
    Path(path).write_text(json.dumps(summary, indent=1, sort_keys=True))
