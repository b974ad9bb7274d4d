"""fgplugin.bench: baselines equal stock DGL / PyG numerically; the CLI writes schema-valid JSON."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fgplugin
from fgplugin.bench import baselines as B

ROOT = Path(__file__).resolve().parents[1]


def _graph(n=300, seed=0):
    """Small undirected graph without self loops, with an isolated node (n - 1)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n - 1, (4 * n,), generator=gen)
    dst = torch.randint(0, n - 1, (4 * n,), generator=gen)
    keep = src != dst
    ei = torch.stack([torch.cat([src[keep], dst[keep]]), torch.cat([dst[keep], src[keep]])])
    ei = torch.unique(ei, dim=1)
    x = torch.randn(n, 40, generator=gen)
    return ei, n, x


def _run(model, graph, x):
    model.eval()
    x = x.clone().requires_grad_(True)
    out = model(x, graph)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("in_feats,hidden,out_feats", [(40, 16, 5), (40, 64, 80)])  # W first / W last
def test_dgl_path_equals_stock_dgl(in_feats, hidden, out_feats):
    _require_dgl()
    ei, n, x = _graph()
    x = x[:, :in_feats]
    w = B.reference_weights(in_feats, hidden, out_feats, seed=1)
    w.b1.normal_()
    w.b2.normal_()
    stock, g_stock, _ = B.build("dgl", w, ei, n)
    path, g_path, _ = B.build("dgl-path", w, ei, n)
    out_s, gx_s, gp_s = _run(stock, g_stock, x)
    out_p, gx_p, gp_p = _run(path, g_path, x)
    assert _rel_err(out_p, out_s) <= 1e-5
    assert _rel_err(gx_p, gx_s) <= 1e-5
    for a, b in zip(gp_p, gp_s):  # same parameter order: W1, b1, W2, b2
        assert _rel_err(a, b.view_as(a)) <= 1e-5


def _rel_err(out, ref):
    """BENCHMARKS.md's error measure: ||out - ref|| / ||ref|| (Frobenius)."""
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def test_every_baseline_matches_stock_pyg():
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GCNConv

    ei, n, x = _graph(seed=2)
    w = B.reference_weights(40, 16, 5, seed=3)
    w.b1.normal_()
    conv1, conv2 = GCNConv(40, 16), GCNConv(16, 5)
    with torch.no_grad():
        conv1.lin.weight.copy_(w.w1.t()); conv1.bias.copy_(w.b1)  # noqa: E702
        conv2.lin.weight.copy_(w.w2.t()); conv2.bias.copy_(w.b2)  # noqa: E702
    expected = conv2(conv1(x, ei).relu(), ei)
    for impl in B.IMPLS + B.VARIANTS:
        if impl in ("dgl", "fgplugin-dgl") and not _has("dgl"):
            continue
        model, graph, _ = B.build(impl, w, ei, n)
        # what convert() gives: fgplugin's dropout in the fgplugin models with all their parts
        assert type(model.dropout) is (fgplugin.Dropout if impl in B.FGPLUGIN_DROPOUT else torch.nn.Dropout), impl
        model.eval()
        out = model(x, graph)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{impl}: {m}")
        assert _rel_err(out, expected) <= 1e-6, impl


def _require_dgl():
    if not _has("dgl"):
        pytest.skip("DGL not installed")
    from fgplugin.dgl import import_dgl
    import_dgl()


def _has(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


def test_cli_epoch_writes_schema_json(tmp_path):
    out = tmp_path / "res"
    proc = subprocess.run([sys.executable, "-m", "fgplugin.bench", "epoch", "--graphs", "tiny", "--epochs", "3",
                           "--warmup", "1", "--device", "cpu", "--out", str(out), "--no-progress"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "epoch.json").read_text())
    for key in ("suite", "device", "torch", "cuda", "commit", "command", "rows"):
        assert key in res
    assert res["suite"] == "epoch" and "python -m fgplugin.bench epoch --graphs tiny" in res["command"]
    assert (out / "epoch.md").is_file()
    epoch_rows = [r for r in res["rows"] if r["op"] == "epoch"]
    from fgplugin.bench.epoch import default_impls
    expected = {(i, o) for i in default_impls("cpu") for o in ("original", "community")}
    assert {(r["impl"], r["order"]) for r in epoch_rows} == expected
    for r in res["rows"]:
        for key in ("graph", "order", "impl", "op", "ms_median"):
            assert key in r
        assert r["ms_median"] is not None or r["error"]
        if r["op"] == "epoch" and r["ms_median"] is not None:
            assert r["ms_min"] <= r["ms_median"] <= r["ms_max"] and r["reps"] == 3
            assert r["precision"] == "fp32" and r["F"] == 32
    assert any(r["impl"] == "fgplugin" and r["ms_median"] for r in epoch_rows)
    # fgplugin keeps layer 1's aggregation of the constant x (fgplugin.input_cache) and counts
    # building it as preprocessing, with that of the restricted backward structure where one was
    # built (fgplugin.grad_rows; not on a graph this small); fgplugin-kernels does neither
    pre = {(r["impl"], r["order"]): r for r in res["rows"] if r["op"] == "preprocess"}
    for order in ("original", "community"):
        kept, plain = pre[("fgplugin", order)], pre[("fgplugin-kernels", order)]
        assert kept["input_cache_ms"] >= 0 and "input_cache_ms" not in plain
        assert "grad_rows_ms" not in plain
        assert kept["ms_median"] == pytest.approx(kept["reorder_ms"] + kept["setup_ms"] + kept["input_cache_ms"]
                                                  + kept.get("grad_rows_ms", 0.0))


def test_cli_bad_suite_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "fgplugin", "bench", "nope"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2
    assert "unknown suite 'nope'" in proc.stderr and "epoch" in proc.stderr


def test_reorder_suite_break_even(tmp_path):
    from fgplugin.bench.cli import main
    assert main(["reorder", "--graphs", "tiny", "--orders", "degsort,community-blockwise2", "--epochs", "2",
                 "--warmup", "0", "--device", "cpu", "--out", str(tmp_path), "--no-progress"]) == 0
    res = json.loads((tmp_path / "reorder.json").read_text())
    rows = {r["order"]: r for r in res["rows"]}
    assert set(rows) == {"original", "degsort", "community-blockwise2"}
    for order in ("degsort", "community-blockwise2"):
        r = rows[order]
        assert r["ms_median"] > 0 and 0 <= r["dense_share"] <= 1 and r["epoch_ms"] > 0 and r["cache_load_ms"] >= 0
        gain = r["epoch_ms_original"] - r["epoch_ms"]
        assert r["break_even_epochs"] == (pytest.approx(r["ms_median"] / gain) if gain > 0 else None)


def test_missing_framework_row_keeps_its_place(monkeypatch):
    from fgplugin.bench import epoch

    def unavailable(*args, **kwargs):
        raise B.ImplUnavailable("DGL not installed")

    monkeypatch.setattr(B, "build", unavailable)
    problem = epoch.load("tiny", "cpu")
    rows = epoch.run_one(problem, "dgl", epochs=1, hidden=8, warmup=0)
    assert [r["op"] for r in rows] == ["epoch", "preprocess", "train200"]
    assert all(r["ms_median"] is None and r["error"] == "DGL not installed" for r in rows)


def test_bench_does_not_import_frameworks():
    code = "import sys, fgplugin.bench, fgplugin.bench.epoch, fgplugin.bench.report; " \
           "print('torch_geometric' in sys.modules, 'dgl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_accuracy_suite_runs_every_impl_on_every_order():
    pytest.importorskip("torch_geometric")
    from fgplugin.bench import epoch

    rows = epoch.run_accuracy_suite(["tiny"], impls=("pyg-edge_index", "fgplugin"), orders=("original", "community"),
                                    seeds=(0, 1), epochs=3, log=lambda *a: None)
    assert {(r["impl"], r["order"]) for r in rows} == {(i, o) for i in ("pyg-edge_index", "fgplugin")
                                                       for o in ("original", "community")}
    for r in rows:
        assert len(r["values"]) == 2 and all(0.0 <= v <= 1.0 for v in r["values"])
        assert r["value"] == pytest.approx(sum(r["values"]) / 2)
