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
