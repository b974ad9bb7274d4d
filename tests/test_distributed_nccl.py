"""fgplugin.distributed over NCCL on 2-4 GPUs against one GPU (the CUDA streams and kernels that
gloo on CPU does not reach): forward and input gradient of dist_spmm within 1e-5."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2+ CUDA GPUs for NCCL (this machine has {GPUS})")
def test_dist_spmm_over_nccl_matches_one_gpu():
    world = min(GPUS, 4)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}  # NVLink multicast stays off on the lent machines
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}", "--standalone",
           str(Path(__file__).with_name("nccl_spmm_check.py"))]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # graphs x exchanges x wire dtypes x replications (1.5D r=2 needs 4 ranks)
    cases = 2 * 2 * 2 * (2 if world >= 4 else 1)
    assert run.stdout.count(" ok") == world * cases, run.stdout
