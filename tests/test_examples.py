"""The examples the README points users to run as printed: the main job (examples/train_gcn.py)
and the two drop-in scripts, on the CPU, each in a fresh interpreter; and the main job's pieces
in this one (its captured copy's step also on a GPU, where there is one)."""
import copy
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import require_dgl
from torch_geometric.data import Data

import fgplugin.pyg
from fgplugin.datasets import community_graph

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> str:
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_main_job_trains_both_models_in_turns_and_writes_its_numbers(tmp_path):
    out = _run("examples/train_gcn.py", "--epochs", "12", "--json", str(tmp_path / "main_job.json"))
    assert "fgplugin kernels: compiled" in out and "speedup per epoch" in out
    rows = json.loads((tmp_path / "main_job.json").read_text())["rows"]
    epoch = {row["impl"]: row for row in rows if row["op"] == "epoch"}
    accuracy = {row["impl"]: row["value"] for row in rows if row["op"] == "accuracy"}
    assert set(epoch) == set(accuracy) == {"pyg-edge_index", "fgplugin"}
    for row in epoch.values():  # epochs 11-12 timed; all 12 in the total
        assert row["warmup"] == 10 and 0 < row["ms_min"] <= row["ms_median"] <= row["ms_max"] < row["ms_total"]
    # the same model from the same weights: the same accuracy up to its dropout masks (the small
    # graph's 8 classes: chance is 0.125; 12 epochs reach about 0.9)
    assert accuracy["fgplugin"] > 0.6 and abs(accuracy["fgplugin"] - accuracy["pyg-edge_index"]) < 0.05
    # on the CPU an epoch is about 16x faster: the reordering is paid back within the first epochs
    (break_even,) = [row["value"] for row in rows if row["op"] == "break_even_epoch"]
    assert 1 <= break_even <= 12 and f"below stock PyG's from epoch {break_even}\n" in out


def _load_main_job():
    spec = importlib.util.spec_from_file_location("train_gcn", ROOT / "examples" / "train_gcn.py")
    train_gcn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_gcn)
    return train_gcn


def test_main_jobs_break_even_epoch_counts_every_epoch_then_extrapolates():
    break_even = _load_main_job().break_even_epoch
    # 1.5 s of preprocessing, a first epoch as slow as stock's, then 1 s saved per epoch: paid at epoch 3
    assert break_even([2.0, 2.0, 2.0, 2.0], [2.0, 1.0, 1.0, 1.0], 1.5, 1) == 3
    # 1.5 s behind after two epochs, 0.5 s saved per median epoch: three more
    assert break_even([1.0, 1.0], [2.0, 0.5], 1.0, 1) == 5.0
    assert break_even([1.0, 1.0], [1.0, 1.0], 0.1, 1) is None  # no faster at the median


def _main_job_model(train_gcn, seed: int = 0):
    graph = community_graph("tiny", seed=seed)
    data = Data(x=graph.x, edge_index=graph.edge_index, y=graph.y, num_nodes=graph.num_nodes)
    data.train_mask = torch.arange(graph.num_nodes) % 3 == 0
    torch.manual_seed(seed)
    return data, fgplugin.pyg.convert(train_gcn.GCN(data.num_features, 16, int(data.y.max()) + 1))


def test_main_jobs_captured_run_trains_a_step_a_call_as_the_eager_one(monkeypatch):
    """Off CUDA graphed_step trains eagerly (saying so): the captured copy's step then trains
    exactly as the eager copy's, a step per call (the warm-up's steps all in the first call, for it
    and the two calls after it), on the graph it is given."""
    train_gcn = _load_main_job()
    made, make = [], train_gcn.fgplugin.graphed_step

    def graphed_step(*args, **kwargs):  # its fallback says why once per process: the reason is read instead
        made.append(make(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(train_gcn.fgplugin, "graphed_step", graphed_step)
    data, model = _main_job_model(train_gcn)
    graph = data.edge_index[:, ::2]  # not the data's own graph: the step must train on the one given
    twin = copy.deepcopy(model)
    initial = {name: value.detach().clone() for name, value in model.named_parameters()}
    trained = []
    for net, captured in ((model, False), (twin, True)):
        optimizer = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)
        step = train_gcn.CapturedStep(net, data, graph, optimizer) if captured else \
            functools.partial(train_gcn._step, net, data, graph, optimizer)
        torch.manual_seed(1)
        for _ in range(5):
            step()
        trained.append(dict(net.named_parameters()))
    for name, value in trained[0].items():
        assert not torch.equal(value, initial[name])
        torch.testing.assert_close(trained[1][name], value, rtol=1e-6, atol=1e-7)
    assert len(made) == 1 and made[0].fallback_reason.startswith("CUDA graphs need")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA GPU")
def test_main_jobs_captured_run_captures_its_step_on_a_gpu():
    train_gcn = _load_main_job()
    data, model = _main_job_model(train_gcn)
    data, model = fgplugin.pyg.BlockReorder()(data.to("cuda")), model.to("cuda")  # as the main job runs it
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    step = train_gcn.CapturedStep(model, data, data.adj_t, optimizer)
    for _ in range(train_gcn.CAPTURE_WARMUP):  # the warm-up's steps, then the capture
        step()
    assert step.graphed.graph is not None and step.graphed.fallback_reason is None
    warmed_up = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):  # replays train
        step()
    torch.cuda.synchronize()
    assert all(not torch.equal(w, p) for w, p in zip(warmed_up, model.parameters()))


def test_main_job_refuses_no_epochs():
    result = subprocess.run([sys.executable, "examples/train_gcn.py", "--epochs", "0"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and "--epochs must be at least 1" in result.stderr


@pytest.mark.parametrize("script, layer", [("pyg_drop_in.py", "fgplugin.pyg.gcn_conv.GCNConv"),
                                           ("dgl_drop_in.py", "fgplugin.dgl.convs.GraphConv")])
def test_drop_in_examples_run_on_fgplugins_layers(script, layer):
    if script.startswith("dgl"):
        require_dgl()
    out = _run(f"examples/{script}")
    assert layer in out and "test accuracy" in out
