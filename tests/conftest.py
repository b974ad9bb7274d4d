import random

import pytest
import torch

import fgplugin  # noqa: F401  (builds/loads the kernels once, before any test runs)


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
