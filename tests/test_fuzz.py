"""Malformed inputs to the C++/CUDA entry points never crash the process (tests/fuzz_ops.py)."""
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fgplugin

SCRIPT = Path(__file__).resolve().parent / "fuzz_ops.py"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and fgplugin.extension_status().cuda else [])


@pytest.mark.parametrize("device", DEVICES)
def test_malformed_op_arguments_raise_and_never_crash(device):
    seed = random.SystemRandom().randrange(2**31)  # a new seed every run; printed on failure
    run = subprocess.run([sys.executable, str(SCRIPT), str(seed), "400", device], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, f"seed {seed}: exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert "400 cases" in run.stdout, run.stdout
