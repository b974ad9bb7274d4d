import os
import random
from pathlib import Path

import pytest
import torch

import fgplugin  # noqa: F401  (builds/loads the kernels once, before any test runs)
from fgplugin.datasets import ENV_VAR, data_dir
from fgplugin.eager import DYNAMO_TRACES_FGPLUGIN

#: ``torch.compile(..., fullgraph=FULLGRAPH)`` for a model of fgplugin's layers: where dynamo
#: cannot trace them (fgplugin.eager.DYNAMO_TRACES_FGPLUGIN) they run eagerly behind a graph break,
#: and the tests of compiled layers check their results only. ``from conftest import FULLGRAPH``.
FULLGRAPH = DYNAMO_TRACES_FGPLUGIN


def traced_whole(graph_break_count: int) -> bool:
    """Whether ``torch._dynamo.explain``'s count fits: no graph break where dynamo traces
    fgplugin's layers, any count where it cannot."""
    return graph_break_count == 0 or not FULLGRAPH


def require_data_dir() -> Path:
    """For tests needing the real ``.npz`` graphs: ``$FGPLUGIN_DATA_DIR``, else skip (locally) or
    fail (in CI, ``$CI`` = ``true`` or ``1``, where a missing or empty data folder is a broken
    setup rather than a reason to skip).

    Import it in a test module with ``from conftest import require_data_dir``.
    """
    folder = data_dir()
    if folder is not None and folder.is_dir() and any(folder.glob("*.npz")):
        return folder
    if folder is None:
        why = f"{ENV_VAR} is not set"
    elif not folder.is_dir():
        why = f"{ENV_VAR}={folder} is not a folder"
    else:
        why = f"{ENV_VAR}={folder} holds no .npz files"
    _fail_in_ci_else_skip(f"real graph data not found: {why}; set {ENV_VAR} to the folder holding the .npz graphs")


def require_dgl():
    """For tests needing DGL: the ``dgl`` module through fgplugin's import shim, else skip
    (locally) or fail (in CI, which installs DGL)."""
    try:
        import fgplugin.dgl as fd
        return fd.import_dgl()
    except ImportError as err:
        _fail_in_ci_else_skip(f"DGL is not usable here: {err}")


def _fail_in_ci_else_skip(msg: str):
    if os.environ.get("CI", "").strip().lower() in ("true", "1"):
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture
def fresh_seed():
    """A new seed every run: kernels must be right on any input. It is printed on failure."""
    return random.SystemRandom().randrange(2**31)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield


# tests/upstream holds the peer libraries' own tests, run against fgplugin's layers after a
# process-global patch(); tests/test_upstream_suites.py runs them in a subprocess of their own
# (with --confcutdir tests/upstream, so this file is not loaded there).
collect_ignore = ["upstream"]
