"""fgplugin.bench: baselines equal stock DGL / PyG numerically; the CLI writes schema-valid JSON,
runs from the installed package alone (no data folder, no source checkout) and reports failures."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fgplugin
from fgplugin.bench import baselines as B

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(fgplugin.__file__).resolve().parent
CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="CUDA memory statistics and the caching allocator: needs a CUDA GPU")
CUDA_KERNELS = pytest.mark.skipif(not (torch.cuda.is_available() and fgplugin.extension_status().cuda),
                                  reason="the spmm suite times fgplugin's CUDA kernels: needs a CUDA GPU and them built")


def _env(**extra):
    """The environment of a CLI run: no data folder, no commit, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("FGPLUGIN_DATA_DIR", "FGPLUGIN_COMMIT")}
    return env | extra


def _cli(args, cwd, timeout=300, **env):
    """``python -m fgplugin bench ARGS`` in ``cwd`` (not the source tree), as a user would run it."""
    return subprocess.run([sys.executable, "-m", "fgplugin", "bench", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=_env(**env))


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
    """docs/benchmarks.md's error measure: ||out - ref|| / ||ref|| (Frobenius)."""
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
        net = model.module if impl == "fgplugin-sharded" else model  # that one is under DDP
        # what convert() gives: fgplugin's dropout in the fgplugin models with all their parts
        assert type(net.dropout) is (fgplugin.Dropout if impl in B.FGPLUGIN_DROPOUT else torch.nn.Dropout), impl
        model.eval()
        out = model(x, graph)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"{impl}: {m}")
        assert _rel_err(out, expected) <= 1e-6, impl
    B.end_one_rank_group()  # fgplugin-sharded's process group: later tests make their own
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("in_feats,hidden,out_feats", [(40, 16, 5), (40, 64, 80)])  # W first / W last
def test_every_sage_baseline_matches_stock_pyg(in_feats, hidden, out_feats):
    """The sage model of every impl: stock PyG SAGEConv's outputs and gradients (eval mode)."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import SAGEConv

    ei, n, x = _graph(seed=4)
    x = x[:, :in_feats]
    w = B.reference_weights(in_feats, hidden, out_feats, seed=5, root=True)
    w.b1.normal_()
    w.b2.normal_()
    stock = B.TwoLayers(SAGEConv(in_feats, hidden), SAGEConv(hidden, out_feats), torch.nn.Dropout(0.5))
    with torch.no_grad():
        for conv, (wl, b, wr) in zip((stock.conv1, stock.conv2), w.layers()):
            conv.lin_l.weight.copy_(wl.t()); conv.lin_l.bias.copy_(b); conv.lin_r.weight.copy_(wr.t())  # noqa: E702
    out_s, gx_s, _ = _run(stock, ei, x)
    for impl in B.IMPLS + B.VARIANTS:
        if impl in ("dgl", "fgplugin-dgl") and not _has("dgl"):
            continue
        model, graph, _ = B.build(impl, w, ei, n, model="sage")
        out, gx, _ = _run(model, graph, x)
        assert _rel_err(out, out_s) <= 1e-5, impl
        assert _rel_err(gx, gx_s) <= 1e-5, impl
    B.end_one_rank_group()


def test_gcn_input_dropout_drops_the_input_in_training_only():
    pytest.importorskip("torch_geometric")
    ei, n, x = _graph(seed=6)
    w = B.reference_weights(40, 16, 5, seed=7)
    for impl in ("fgplugin", "pyg-edge_index", "cusparse-cached"):
        plain, graph, _ = B.build(impl, w, ei, n)
        model, graph, _ = B.build(impl, w, ei, n, model="gcn-input-dropout")
        assert type(model.input_dropout) is type(model.dropout) and plain.input_dropout is None, impl
        plain.eval(), model.eval()
        assert torch.equal(model(x, graph), plain(x, graph)), impl  # eval: no dropout anywhere
        model.train()
        model.dropout.p = 0.0  # only the input's dropout left: the first layer sees a new input
        torch.manual_seed(0)
        assert _rel_err(model(x, graph), plain(x, graph)) > 1e-2, impl
    with pytest.raises(ValueError, match="root weights"):
        B.build("fgplugin", w, ei, n, model="sage")
    with pytest.raises(ValueError, match="unknown model"):
        B.build("fgplugin", w, ei, n, model="gat")


def test_cli_epoch_runs_each_model(tmp_path):
    from fgplugin.bench.cli import main

    # (torch.sparse.mm has no bf16 on CPUs: cusparse-cached would fail its bf16 rows here)
    assert main(["epoch", "--graphs", "tiny", "--impls", "fgplugin,pyg-edge_index", "--orders", "original",
                 "--models", "gcn-input-dropout,sage", "--precisions", "fp32,bf16", "--epochs", "2", "--warmup",
                 "1", "--device", "cpu", "--out", str(tmp_path), "--no-progress"]) == 0
    res = json.loads((tmp_path / "epoch.json").read_text())
    assert res["models"] == ["gcn-input-dropout", "sage"] and res["precisions"] == ["fp32", "bf16"]
    assert {(r["model"], r["precision"], r["impl"]) for r in res["rows"] if r["op"] == "epoch"} == {
        (m, p, i) for m in ("gcn-input-dropout", "sage") for p in ("fp32", "bf16") for i in ("fgplugin", "pyg-edge_index")}
    assert all(r["ms_median"] > 0 for r in res["rows"] if r["op"] == "epoch")
    assert "Model `sage`, bf16" in (tmp_path / "epoch.md").read_text()
    # each ratio against fgplugin's row of the same model and precision
    ms = {(r["model"], r["precision"], r["impl"]): r["ms_median"] for r in res["rows"] if r["op"] == "epoch"}
    for r in res["rows"]:
        if r["op"] == "epoch":
            assert r["vs_fgplugin"] == pytest.approx(r["ms_median"] / ms[(r["model"], r["precision"], "fgplugin")])
    with pytest.raises(SystemExit):
        main(["epoch", "--graphs", "tiny", "--models", "gat", "--device", "cpu", "--out", str(tmp_path)])


def test_cli_epoch_baselines_take_the_captured_step_too(tmp_path, monkeypatch):
    """``<baseline>-graphed`` trains the baseline's model by fgplugin.graphed_step: off CUDA
    eagerly (its warning; the rows say ``captured: false`` and count no capture)."""
    from fgplugin import graphed
    from fgplugin.bench.cli import main

    monkeypatch.setattr(graphed, "_warned", set())  # graphed_step says a reason once per process
    impls = "fgplugin-graphed,cusparse-cached-graphed,pyg-edge_index-graphed,cusparse-cached"
    with pytest.warns(graphed.GraphedStepWarning, match="eagerly"):
        assert main(["epoch", "--graphs", "tiny", "--impls", impls, "--orders", "original", "--epochs", "2",
                     "--warmup", "1", "--device", "cpu", "--out", str(tmp_path), "--no-progress"]) == 0
    rows = json.loads((tmp_path / "epoch.json").read_text())["rows"]
    pre = {r["impl"]: r for r in rows if r["op"] == "preprocess"}
    assert {r["impl"] for r in rows if r["op"] == "epoch" and r["ms_median"]} == set(impls.split(","))
    for r in rows:
        assert r.get("captured") is (False if r["impl"].endswith("-graphed") else None)
        assert "capture_ms" not in r
    assert all(r["first_step_ms"] > 0 for r in pre.values())  # graphed_step's first warm-up step too


class _FakeCapturedStep:
    """Stands in for graphed_step's object on the CPU: ``recaptures_at`` the call that captures again."""

    def __init__(self, graph, recaptures_at=None):
        self.graph, self.captures, self.capture_s, self.calls = graph, 1, 0.005, 0
        self.fallback_reason, self.recaptures_at = "RuntimeError: no capture here", recaptures_at

    def __call__(self):
        self.calls += 1
        if self.calls == self.recaptures_at:
            self.captures += 1


@pytest.mark.parametrize("step, error", [(_FakeCapturedStep(object()), None),
                                         (_FakeCapturedStep(None), "could not be captured: RuntimeError: no capture"),
                                         (_FakeCapturedStep(object(), recaptures_at=2), "captured again while timed")],
                         ids=["captured", "not-captured", "captured-again"])
def test_a_captured_row_counts_its_capture_and_refuses_an_eager_step(monkeypatch, step, error):
    """Where steps are captured (CUDA; here a stand-in step): the capture's seconds go to the
    preprocess row; a step that was not captured, or was captured again while timed, is the row's
    error, not an eager row under a captured name."""
    from fgplugin.bench import epoch

    monkeypatch.setattr(epoch, "_can_capture", lambda device: True)
    monkeypatch.setattr(epoch, "warmed_up_step", lambda *args, **kwargs: step)
    rows = epoch.run_one(epoch.load("tiny", "cpu"), "cusparse-cached-graphed", epochs=3, hidden=8, warmup=1)
    by_op = {r["op"]: r for r in rows}
    if error is None:
        assert by_op["epoch"]["captured"] is True and by_op["preprocess"]["capture_ms"] == pytest.approx(5.0)
        assert by_op["preprocess"]["ms_median"] == pytest.approx(by_op["preprocess"]["setup_ms"] + 5.0)
    else:
        assert all(error in r["error"] and r["ms_median"] is None for r in rows)


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
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "epoch.json").read_text())
    for key in ("suite", "device", "torch", "cuda", "commit", "command", "rows", "fgplugin_version"):
        assert key in res
    assert res["suite"] == "epoch" and "python -m fgplugin.bench epoch --graphs tiny" in res["command"]
    assert res["commit"] is None and res["fgplugin_version"] == fgplugin.__version__
    assert (out / "epoch.md").is_file()
    epoch_rows = [r for r in res["rows"] if r["op"] == "epoch"]
    from fgplugin.bench.epoch import default_impls
    expected = {(i, o) for i in default_impls("cpu") for o in ("original", "community")}
    assert {(r["impl"], r["order"]) for r in epoch_rows} == expected
    for r in res["rows"]:
        for key in ("graph", "order", "impl", "op", "ms_median"):
            assert key in r
        assert r["ms_median"] is not None and not r.get("error"), r  # defaults: only impls that can run
        if r["op"] == "epoch":
            assert r["ms_min"] <= r["ms_median"] <= r["ms_max"] and r["reps"] == 3
            assert r["precision"] == "fp32" and r["F"] == 32
    assert any(r["impl"] == "fgplugin" and r["ms_median"] for r in epoch_rows)
    # fgplugin keeps layer 1's aggregation of the constant x (fgplugin.input_cache) and counts
    # building it as preprocessing, with that of the restricted backward structure where one was
    # built (fgplugin.grad_rows; not on a graph this small); fgplugin-kernels does neither
    pre = {(r["impl"], r["order"]): r for r in res["rows"] if r["op"] == "preprocess"}
    steps = {(r["impl"], r["order"]): r for r in epoch_rows}
    for order in ("original", "community"):
        # tiny's features are dense random numbers: the aggregation is kept, not a sparse input
        assert steps[("fgplugin", order)]["kept_input"] == "dense"
        assert "kept_input" not in steps[("fgplugin-kernels", order)]
        kept, plain = pre[("fgplugin", order)], pre[("fgplugin-kernels", order)]
        assert kept["input_cache_ms"] >= 0 and "input_cache_ms" not in plain
        assert "grad_rows_ms" not in plain
        assert kept["ms_median"] == pytest.approx(kept["reorder_ms"] + kept["setup_ms"] + kept["input_cache_ms"]
                                                  + kept.get("grad_rows_ms", 0.0) + kept["first_use_ms"])
    # every impl's first step (the first warm-up step) is on its preprocess row, its lazy work counted
    for (impl, order), r in pre.items():
        assert r["first_step_ms"] > 0 and r["first_use_ms"] >= 0, (impl, order)
        assert r["ms_median"] >= r["reorder_ms"] + r["setup_ms"] + r["first_use_ms"] - 1e-9, (impl, order)


def test_cli_runs_without_data_or_checkout(tmp_path):
    """(a) A synthetic graph needs no data folder; run away from the source tree, the command
    writes its JSON, records the commit it is given and exits 0."""
    out = tmp_path / "out"
    proc = _cli(["epoch", "--device", "cpu", "--graphs", "tiny", "--epochs", "1", "--warmup", "0", "--impls",
                 "fgplugin", "--orders", "original", "--out", str(out), "--no-progress"], cwd=tmp_path,
                FGPLUGIN_COMMIT="0123abc")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "epoch.json").read_text())
    assert res["commit"] == "0123abc" and res["fgplugin_version"] == fgplugin.__version__
    assert [(r["graph"], r["impl"], r["op"]) for r in res["rows"]] == [
        ("tiny", "fgplugin", op) for op in ("epoch", "preprocess", "train200")]
    assert all(r["ms_median"] is not None for r in res["rows"]) and "FAILED" not in proc.stderr


def test_cli_failed_row_is_reported_and_exits_1(tmp_path):
    """(b) An unknown graph fails its rows: each printed on stderr with graph / order / impl and
    the reason (here: no data folder to look the name up in); the rest still runs."""
    out = tmp_path / "out"
    proc = _cli(["epoch", "--device", "cpu", "--graphs", "no-such-graph,tiny", "--epochs", "1", "--warmup", "0",
                 "--impls", "fgplugin", "--orders", "original", "--out", str(out), "--no-progress",
                 "--commit", "feedbee"], cwd=tmp_path, FGPLUGIN_COMMIT="ignored")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert re.search(r"FAILED no-such-graph / original / fgplugin .*FileNotFoundError.*FGPLUGIN_DATA_DIR",
                     proc.stderr), proc.stderr[-3000:]
    assert "FAILED tiny" not in proc.stderr
    res = json.loads((out / "epoch.json").read_text())
    assert res["commit"] == "feedbee"
    ok = [r for r in res["rows"] if r["graph"] == "tiny"]
    assert ok and all(r["ms_median"] is not None for r in ok)


def test_cli_unrunnable_explicit_impl_is_a_failed_row(tmp_path, monkeypatch, capsys):
    from fgplugin.bench.cli import main

    def unavailable(*args, **kwargs):
        raise B.ImplUnavailable("DGL not installed")

    monkeypatch.setattr(B, "build", unavailable)
    monkeypatch.delenv("FGPLUGIN_COMMIT", raising=False)
    assert main(["epoch", "--device", "cpu", "--graphs", "tiny", "--epochs", "1", "--warmup", "0", "--impls", "dgl",
                 "--orders", "original", "--out", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "FAILED tiny / original / dgl (epoch, preprocess, train200): DGL not installed" in err


def test_default_impls_leave_out_what_cannot_run(monkeypatch):
    from fgplugin.bench import epoch

    missing = {"dgl", "fgplugin-dgl"}
    monkeypatch.setattr(B, "unavailable", lambda impl, device: "DGL not installed" if impl in missing else None)
    left_out = {}
    impls = epoch.default_impls("cpu", left_out)
    assert not missing & set(impls) and "fgplugin" in impls and "fgplugin-torch-dropout" in impls
    assert left_out == {"DGL not installed": ["dgl", "fgplugin-dgl"]}
    assert "fgplugin-torch-dropout" not in epoch.candidate_impls("cuda")


@pytest.mark.parametrize("suite", ["spmm", "threshold"])
def test_gpu_suites_without_gpu_exit_2(suite, tmp_path, capsys):
    """(d) The spmm and threshold suites time CUDA kernels: no GPU, nothing run, status 2."""
    if torch.cuda.is_available() and fgplugin.extension_status().cuda:
        pytest.skip("this machine can run the GPU suites")
    from fgplugin.bench.cli import main

    assert main([suite, "--quick", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"fgplugin bench {suite}:" in err and "CUDA" in err and "Nothing was run" in err
    assert not (tmp_path / "out").exists()


def test_gpu_suite_on_cpu_device_exits_2(tmp_path, capsys):
    from fgplugin.bench.cli import main

    assert main(["spmm", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_cli_spmm_without_gpu_in_a_subprocess(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = _cli(["spmm"], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr, proc.stderr[-2000:]


def test_accuracy_without_data_exits_2(tmp_path, monkeypatch, capsys):
    from fgplugin.bench.cli import main

    monkeypatch.delenv("FGPLUGIN_DATA_DIR", raising=False)
    assert main(["accuracy", "--device", "cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "set FGPLUGIN_DATA_DIR" in err.replace("Set", "set") and "--graphs" in err
    monkeypatch.setenv("FGPLUGIN_DATA_DIR", str(tmp_path))  # a folder without the graphs
    assert main(["accuracy", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "cora.npz" in capsys.readouterr().err


def test_spmm_options_belong_to_spmm(tmp_path):
    from fgplugin.bench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["epoch", "--reps", "3", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        main(["spmm", "--impls", "dgl", "--out", str(tmp_path)])  # not an impl of the spmm suite


_BESIDE_THE_CHECKOUT = r"\.\./[\w-]+/(data|docs)\b"  # a folder next to a source checkout, e.g. ../<x>/data
_BENCH_CODE = [PACKAGE / "__main__.py", *sorted((PACKAGE / "bench").rglob("*.py")),
               *sorted((PACKAGE / "datasets").rglob("*.py"))]


@pytest.mark.parametrize("path", _BENCH_CODE, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_bench_code_is_self_contained(path):
    """(c) The bench code runs from an installed package: no child process of its own, no
    version control, no test framework, no data folder beside a checkout, no checkout scripts."""
    text = path.read_text()
    for pattern in (r"subprocess", r"\bgit\b", r"pytest", _BESIDE_THE_CHECKOUT, r"(?<!docs/)benchmarks/\w+\.py"):
        assert not re.search(pattern, text), f"{path.name}: {pattern}"


def test_package_names_no_data_folder_beside_a_checkout():
    """(c) Nowhere in the package or its adapters (tests excluded) is the data folder a relative
    path beside the source tree: data comes from $FGPLUGIN_DATA_DIR or a given path."""
    roots = [PACKAGE, *(p for p in (PACKAGE.parent / "adapters",) if p.is_dir())]
    offenders = [str(p) for root in roots for p in root.rglob("*.py")
                 if "tests" not in p.relative_to(root).parts and re.search(_BESIDE_THE_CHECKOUT, p.read_text())]
    assert offenders == []


def test_cli_bad_suite_is_a_clear_error(tmp_path):
    proc = _cli(["nope"], cwd=tmp_path, timeout=120)
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


def test_epoch_rounds_alternate_the_impls(monkeypatch):
    from fgplugin.bench import epoch

    order = []
    timed = epoch.timed

    def logged(step, device, steps):
        order.append((step, steps))
        return timed(step, device, steps)

    monkeypatch.setattr(epoch, "timed", logged)
    rows = epoch.run_epoch_suite(["tiny"], ("fgplugin", "cusparse-cached", "no-such-impl"), ("original",), epochs=7,
                                 warmup=1, log=lambda *a: None, rounds=3)
    steps = [n for _, n in order]
    assert steps == [3, 3, 2, 2, 2, 2]  # 7 steps in 3 rounds, the two impls that built taking turns
    first, second = order[0][0], order[1][0]  # the order rotated by one each round
    assert first is not second and [s for s, _ in order[2:]] == [second, first, first, second]
    by_impl = {r["impl"]: r for r in rows if r["op"] == "epoch"}
    for impl in ("fgplugin", "cusparse-cached"):
        assert by_impl[impl]["reps"] == 7 and by_impl[impl]["ms_median"] > 0 and by_impl[impl]["peak_mem_bytes"] is None
    assert by_impl["no-such-impl"]["ms_median"] is None and "unknown impl" in by_impl["no-such-impl"]["error"]
    assert [r["impl"] for r in rows if r["op"] == "epoch"] == ["fgplugin", "cusparse-cached", "no-such-impl"]


def test_bench_does_not_import_frameworks():
    code = "import sys, fgplugin.bench, fgplugin.bench.epoch, fgplugin.bench.report, fgplugin.bench.spmm, " \
           "fgplugin.bench.scaling; print('torch_geometric' in sys.modules, 'dgl' in sys.modules)"
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


def test_accuracy_suite_trains_under_autocast(tmp_path):
    """--precisions bf16,fp16 trains every impl with torch.autocast around the forward: one row per
    precision, labelled, in the summary's columns."""
    pytest.importorskip("torch_geometric")
    from fgplugin.bench.cli import main

    assert main(["accuracy", "--graphs", "tiny", "--impls", "pyg-edge_index,fgplugin", "--orders", "original",
                 "--seeds", "0", "--epochs", "3", "--precisions", "fp32,bf16,fp16", "--device", "cpu",
                 "--out", str(tmp_path), "--no-progress"]) == 0
    res = json.loads((tmp_path / "accuracy.json").read_text())
    assert {(r["impl"], r["precision"]) for r in res["rows"]} == {
        (i, p) for i in ("pyg-edge_index", "fgplugin") for p in ("fp32", "bf16", "fp16")}
    assert all(0.0 <= r["value"] <= 1.0 for r in res["rows"])
    assert "fgplugin (original, bf16)" in (tmp_path / "accuracy.md").read_text()
    with pytest.raises(SystemExit):
        main(["accuracy", "--graphs", "tiny", "--precisions", "tf32", "--device", "cpu", "--out", str(tmp_path)])


def test_reorder_suite_unknown_graph_keeps_its_rows(tmp_path, capsys):
    from fgplugin.bench.cli import main
    assert main(["reorder", "--graphs", "no-such-graph", "--orders", "degsort", "--device", "cpu", "--out",
                 str(tmp_path), "--no-progress"]) == 1
    rows = json.loads((tmp_path / "reorder.json").read_text())["rows"]
    assert [(r["order"], r["ms_median"]) for r in rows] == [("original", None), ("degsort", None)]
    assert "FAILED no-such-graph / degsort / fgplugin" in capsys.readouterr().err


def test_accuracy_suite_unknown_graph_keeps_its_rows():
    from fgplugin.bench import epoch

    rows = epoch.run_accuracy_suite(["no-such-graph"], impls=("fgplugin",), orders=("original",), seeds=(0,),
                                    epochs=1, log=lambda *a: None)
    assert len(rows) == 1 and rows[0]["value"] is None and "FileNotFoundError" in rows[0]["error"]


def test_failures_group_a_runs_rows():
    from fgplugin.bench.report import failures

    rows = [{"graph": "g", "order": "original", "impl": "dgl", "op": op, "error": "DGL not installed"}
            for op in ("epoch", "preprocess", "train200")]
    rows += [{"graph": "g", "order": "original", "impl": "fgplugin", "op": "epoch", "ms_median": 1.0, "error": None}]
    assert failures(rows) == ["g / original / dgl (epoch, preprocess, train200): DGL not installed"]


# ---------------------------------------------------------------- spmm / threshold / scaling suites
def test_spmm_sample_reference_matches_dense():
    from fgplugin.bench.spmm import sample_reference

    ei, n, x = _graph(n=120, seed=4)
    adj = fgplugin.TiledAdjacency.from_edge_index(ei, n)
    r, c, d = adj.norm("gcn")
    dense = torch.zeros(n, n, dtype=torch.float64)
    dense[torch.repeat_interleave(torch.arange(n), adj.rowptr.long().diff()), adj.col.long()] = 1.0
    full = r.double()[:, None] * ((dense + torch.diag(d.double())) @ (c.double()[:, None] * x.double()))
    rows = torch.tensor([0, 5, 17, n - 1])
    torch.testing.assert_close(sample_reference(adj.rowptr, adj.col, x, r, c, d, rows), full[rows])


def test_threshold_auto_vs_best():
    from fgplugin.bench.spmm import auto_vs_best

    rows = [{"graph": "g", "order": "community", "op": "spmm_fwd", "threshold": t, "ms_median": ms}
            for t, ms in (("auto", 1.1), (0.02, 1.0), (0.05, 1.2), (0.1, None))]
    assert auto_vs_best(rows) == [{"graph": "g", "order": "community", "op": "spmm_fwd", "auto_over_best_fixed": 1.1}]


def test_scaling_help_runs_from_the_module(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fgplugin.bench.scaling", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120, env=_env())
    assert proc.returncode == 0 and "--gpus" in proc.stdout and "--launch-timeout" in proc.stdout, proc.stderr


def test_scaling_gloo_smoke_run(tmp_path):
    """The scaling suite's CPU path: one gloo rank launched through torch.distributed.run with
    ``-m fgplugin.bench.scaling`` (no script path), on the tiny preset."""
    out = tmp_path / "out"
    proc = _cli(["scaling", "--graphs", "tiny", "--gpus", "1", "--backend", "gloo", "--epochs", "1", "--warmup", "0",
                 "--orders", "original", "--comm", "sparse", "--out", str(out), "--cache", str(tmp_path / "perm"),
                 "--commit", "c0ffee"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    res = json.loads((out / "scaling.json").read_text())
    assert res["suite"] == "scaling" and res["commit"] == "c0ffee" and res["fgplugin_version"] == fgplugin.__version__
    assert res["command"].endswith("bench scaling --graphs tiny --gpus 1 --backend gloo --epochs 1 --warmup 0 "
                                   f"--orders original --comm sparse --out {out} --cache {tmp_path / 'perm'} "
                                   "--commit c0ffee")
    impls = {(r["impl"], r["scheme"]) for r in res["rows"]}
    assert impls == {("fgplugin-dist-sparse", "1d"), ("fgplugin", "single")}
    for r in res["rows"]:
        assert r["graph"] == "tiny" and r["gpus"] == 1 and r["order"] == "original" and r["ms_median"] > 0
    assert not list(out.glob(".scaling_part_*"))


def test_host_suite_times_both_products(tmp_path):
    """``fgplugin bench host`` writes one row per impl with a positive host time per call (and no
    device time on the CPU), and the CSR it times (the cusparse-cached baseline's) is the GCN
    product fgplugin computes."""
    from fgplugin.bench import host
    from fgplugin.bench.cli import main
    from fgplugin.datasets import load_graph
    from fgplugin.testing import rel_error

    assert main(["host", "--graphs", "tiny", "--device", "cpu", "--calls", "20", "--reps", "2",
                 "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "host.json").read_text())
    assert res["suite"] == "host" and [r["impl"] for r in res["rows"]] == list(host.IMPLS)
    assert all(r["host_us"] > 0 and r["gpu_us"] is None and r["calls"] == 20 for r in res["rows"])
    g = load_graph("tiny", "cpu")
    adj = fgplugin.TiledAdjacency.from_edge_index(g.edge_index, g.num_nodes)
    norm = adj.norm("gcn", dtype=torch.float32)
    x = torch.randn(g.num_nodes, 5)
    csr = B.CachedCSRGraph(g.edge_index, g.num_nodes).csr()
    assert rel_error(torch.sparse.mm(csr, x), fgplugin.spmm(adj, x, *norm)) < 1e-5


def test_a_failed_impl_frees_its_model_before_the_others_run(monkeypatch):
    """In rounds mode a failed impl's model is released when it fails, not after every other impl
    of the graph has been timed (after an out-of-memory error they need that memory)."""
    import weakref
    from fgplugin.bench import epoch

    built, alive_while_timing = [], []
    real_step, real_timed = epoch.warmed_up_step, epoch.timed
    monkeypatch.setattr(epoch, "_warm_up_models", lambda *args: None)  # its steps would take the failure

    def failing_first(model, *args, **kwargs):
        built.append(weakref.ref(model))
        if len(built) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return real_step(model, *args, **kwargs)

    def timed(step, device, steps):
        import gc
        gc.collect()
        alive_while_timing.append(built[0]() is not None)
        return real_timed(step, device, steps)

    monkeypatch.setattr(epoch, "warmed_up_step", failing_first)
    monkeypatch.setattr(epoch, "timed", timed)
    rows = epoch.run_epoch_suite(["tiny"], ("fgplugin", "cusparse-cached"), ("original",), epochs=4, warmup=1,
                                 log=lambda *a: None, rounds=2)
    by_impl = {r["impl"]: r for r in rows if r["op"] == "epoch"}
    assert by_impl["fgplugin"]["error"] == "OOM" and by_impl["cusparse-cached"]["ms_median"] > 0
    assert alive_while_timing == [False, False]  # the failed model was gone while the other one ran


def test_the_suites_warm_up_probes_its_tiny_graph_as_a_large_one(monkeypatch):
    """The warm-up loads the threshold probe's kernels on a tiny graph, which is under the probe's
    floor of non-zeros: the floor is lifted while it runs, and restored after."""
    from fgplugin import autotune
    from fgplugin.bench import epoch

    seen = []
    monkeypatch.setattr(epoch, "_train_each_model_once", lambda *args: seen.append(autotune.PROBE_MIN_NNZ))
    floor = autotune.PROBE_MIN_NNZ
    epoch._warm_up_models(torch.device("cpu"), ("fgplugin",), ("gcn",))
    assert seen == [0] and autotune.PROBE_MIN_NNZ == floor > 0


def test_the_suites_warm_up_trains_each_impls_model(monkeypatch):
    """The warm-up runs training steps of every impl's model on the tiny graph (a process's first
    step of a layer's code loads its kernels and allocator blocks, which no graph's preprocessing
    should count), not only builds them."""
    from fgplugin.bench import epoch

    stepped = []
    real_train_step = epoch.train_step
    monkeypatch.setattr(epoch, "train_step", lambda model, *a, **k: (stepped.append(type(model.conv1).__module__),
                                                                     real_train_step(model, *a, **k)))
    epoch._warm_up_models(torch.device("cpu"), ("fgplugin", "cusparse-cached"), ("gcn",))
    assert sorted(set(stepped)) == sorted({"fgplugin.bench.baselines", type(fgplugin.pyg.GCNConv(4, 4)).__module__})
    assert len(stepped) >= 4, stepped


# ---------------------------------------------------------------- spmm suite: dgl-path, checked products
def _spmm_run(n=200, seed=4):
    """The spmm suite's graph of ``_graph`` on the CPU, with features and the sampled rows' float64
    reference of the forward product (the last row never sampled)."""
    from fgplugin.bench.spmm import GraphRun, sample_reference

    ei, n, x = _graph(n=n, seed=seed)
    run = GraphRun("g", "original", ei, n)
    rows = torch.arange(0, n - 1, 3)
    return run, x, rows, sample_reference(run.adj.rowptr, run.adj.col, x, run.r, run.c, run.d, rows)


def test_spmm_baselines_compute_the_suites_product():
    """cusparse-cached and dgl-path, forward and backward, are the product every spmm row is
    checked against (the float64 reference of diag(r)(A + diag(d))diag(c) X with adj.norm("gcn"))."""
    from fgplugin.bench.spmm import BASELINES, check_product, sample_reference

    run, x, _, _ = _spmm_run(n=300)
    rows = torch.arange(run.n)
    for which, (rowptr, col, r, c) in {"spmm_fwd": (run.adj.rowptr, run.adj.col, run.r, run.c),
                                       "spmm_bwd": (run.t_rowptr, run.t_col, run.c, run.r)}.items():
        ref = sample_reference(rowptr, col, x, r, c, run.d, rows)
        for impl in BASELINES:
            rel_err, error = check_product(run.baseline_product(impl, which, torch.float32)(x), ref, rows, "fp32")
            assert error is None and rel_err <= 1e-6, (impl, which, rel_err)


def test_spmm_dgl_path_runs_the_epoch_suites_dgl_path():
    """On a directed graph (forward and backward differ): the spmm suite's dgl-path products are
    DGLPathConv's aggregation (W = I, no bias) and the gradient autograd computes through it, on
    the transposed CSR it builds once."""
    gen = torch.Generator().manual_seed(8)
    n, features = 150, 12
    ei = torch.unique(torch.randint(0, n, (2, 900), generator=gen), dim=1)
    g = B.DGLPathGraph(ei, n)
    conv = B.DGLPathConv(torch.eye(features), torch.zeros(features))
    x = torch.randn(n, features, generator=gen, requires_grad=True)
    out = conv(x, g)
    grad = torch.randn(n, features, generator=gen)
    out.backward(grad)
    assert _rel_err(B.dgl_path_product(x.detach(), g), out.detach()) <= 1e-6
    assert _rel_err(B.dgl_path_adjoint(grad, g, g.src_norm(), g.dst_norm()), x.grad) <= 1e-6
    assert _rel_err(B.dgl_path_adjoint(grad, g, g.src_norm(), g.dst_norm()), B.dgl_path_product(grad, g)) > 1e-2


def test_spmm_dgl_path_rows_are_checked_against_dgls_own_product():
    """On a directed graph DGL's product (source side scaled by out-degrees) is not the suite's GCN
    product: its rows are checked against DGL's own float64 reference, which they pass, forward
    and backward, and which a wrong product fails."""
    from fgplugin.bench.spmm import GraphRun, check_product, sample_reference

    gen = torch.Generator().manual_seed(8)
    n = 150
    ei = torch.unique(torch.randint(0, n, (2, 900), generator=gen), dim=1)
    run = GraphRun("g", "original", ei, n)
    x = torch.randn(n, 12, generator=gen)
    rows = torch.arange(n)
    gcn = sample_reference(run.adj.rowptr, run.adj.col, x, run.r, run.c, run.d, rows)
    for which in ("spmm_fwd", "spmm_bwd"):
        ref = run.dgl_path_reference(which, x, rows)
        out = run.baseline_product("dgl-path", which, torch.float32)(x)
        assert check_product(out, ref, rows, "fp32") == (pytest.approx(0, abs=1e-6), None)
        assert check_product(out, gcn, rows, "fp32")[1] is not None  # the GCN product is another one
        assert check_product(out * (1 + 1e-4), ref, rows, "fp32")[1] is not None


def test_spmm_check_fails_a_product_over_its_limit_or_with_nan():
    """A row whose product is off by more than its precision's limit, or holds a NaN anywhere (an
    element it never wrote reads NaN on poisoned memory), fails: rel_err kept, the error names
    what failed and the limit, and the command's failure report lists it."""
    from fgplugin.bench.report import failures
    from fgplugin.bench.spmm import checked

    run, x, rows, ref = _spmm_run()
    right = run.baseline_product("cusparse-cached", "spmm_fwd", torch.float32)
    assert checked(row := {"precision": "fp32"}, right, x, ref, rows) and "error" not in row
    assert row["rel_err"] <= 1e-6

    def off(x):  # 1e-4 relative error: over fp32's limit, within bf16's
        return right(x) * (1 + 1e-4)

    row = {"graph": "g", "order": "original", "impl": "cusparse-cached", "op": "spmm_fwd", "precision": "fp32"}
    assert not checked(row, off, x, ref, rows)
    assert row["rel_err"] == pytest.approx(1e-4, rel=1e-2) and row["error"] == "rel_err 1.00e-04 over the fp32 limit 1e-05"
    assert failures([row]) == ["g / original / cusparse-cached (spmm_fwd): rel_err 1.00e-04 over the fp32 limit 1e-05"]
    assert checked(row := {"precision": "bf16"}, off, x, ref, rows) and "error" not in row

    def unwritten_last_row(x):  # outside the sampled rows: only the NaN check sees it
        out = right(x)
        out[-1] = float("nan")
        return out

    assert not checked(row := {"precision": "fp32"}, unwritten_last_row, x, ref, rows)
    assert row["rel_err"] <= 1e-6 and row["error"].startswith(f"NaN in {x.shape[1]} of {x.numel()} output elements")


@CUDA
def test_poisoned_blocks_are_handed_to_the_next_allocations():
    """After poison_free_blocks, the next allocations of the output's size read NaN (what a product
    leaves unwritten), even where the allocator held a block of finished results."""
    from fgplugin.bench.spmm import POISONED_BLOCKS, poison_free_blocks

    like = torch.randn(3000, 96, device="cuda")
    numbers = torch.ones_like(like)
    del numbers  # a free block holding numbers: what an unwritten output would read
    poison_free_blocks(like)
    outputs = [torch.empty_like(like) for _ in range(POISONED_BLOCKS)]
    assert all(bool(out.isnan().all()) for out in outputs)


@CUDA_KERNELS
def test_spmm_suite_checks_and_times_the_dgl_path(tmp_path):
    """The spmm suite's rows of fgplugin and both baselines at fp32 and bf16: each checked within
    its limit, then timed; dgl-path at every width and precision, as cusparse-cached."""
    from fgplugin.bench.cli import main
    from fgplugin.bench.spmm import REL_ERR_LIMIT

    assert main(["spmm", "--graphs", "tiny", "--orders", "original", "--F", "32,128", "--sweep-graph", "tiny",
                 "--sweep-order", "original", "--precisions", "fp32,bf16", "--impls",
                 "fgplugin,cusparse-cached,dgl-path", "--reps", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "spmm.json").read_text())["rows"]
    assert {(r["impl"], r["op"], r["F"], r["precision"]) for r in rows} == {
        (i, op, f, p) for i in ("fgplugin", "cusparse-cached", "dgl-path") for op in ("spmm_fwd", "spmm_bwd")
        for f in (32, 128) for p in ("fp32", "bf16")}
    for r in rows:
        assert not r.get("error") and r["rel_err"] <= REL_ERR_LIMIT[r["precision"]] and r["ms_median"] > 0, r


@CUDA_KERNELS
def test_spmm_suite_fails_a_product_that_writes_nothing(tmp_path, monkeypatch, capsys):
    """A kernel that never writes its output (here: fgplugin's op replaced by an empty tensor) reads
    NaN on the poisoned memory, even where the allocator held the right product from a call
    before: its rows fail untimed and the command exits with status 1; the baselines' rows pass."""
    from fgplugin.bench import spmm
    from fgplugin.bench.cli import main

    monkeypatch.setattr(spmm, "spmm_op", lambda rowptr, col, x, *rest: torch.empty_like(x))
    assert main(["spmm", "--graphs", "tiny", "--orders", "original", "--F", "128", "--precisions", "fp32",
                 "--impls", "fgplugin-csr,cusparse-cached,dgl-path", "--reps", "2", "--out", str(tmp_path)]) == 1
    rows = json.loads((tmp_path / "spmm.json").read_text())["rows"]
    for r in rows:
        if r["impl"] == "fgplugin-csr":
            assert r["error"].startswith("NaN in") and r["ms_median"] is None, r
        else:
            assert not r.get("error") and r["ms_median"] > 0, r
    assert "FAILED tiny / original / fgplugin-csr (spmm_fwd, spmm_bwd): NaN in" in capsys.readouterr().err


# ---------------------------------------------------------------- epoch suite: each impl's memory, its first step
def test_epoch_peak_memory_is_each_impls_own(monkeypatch):
    """peak_mem_bytes, one definition in both modes: what the impl holds once built and warmed up
    (fgplugin on a reordered graph with the adjacency built with the reordering) plus the largest
    rise within a round of its timed steps; the problem's shared tensors not counted. The CUDA
    memory readings are stand-ins here (CPU runs record None)."""
    from fgplugin.bench import epoch

    monkeypatch.setattr(epoch, "_warm_up_models", lambda *args: None)  # a tiny graph's models: no readings
    readings = iter([1000, 1300,  # reordered: fgplugin's adjacency holds 300
                     1400, 1450,  # fgplugin built and warmed up: 50
                     1450, 1530])  # cusparse-cached: 80
    monkeypatch.setattr(epoch, "_allocated", lambda device: next(readings))
    rises = iter([7, 20, 5, 9])  # rounds: fgplugin, cusparse-cached; then cusparse-cached, fgplugin
    timed = epoch.timed
    monkeypatch.setattr(epoch, "timed", lambda step, device, steps: (timed(step, device, steps)[0], next(rises)))
    rows = epoch.run_epoch_suite(["tiny"], ("fgplugin", "cusparse-cached"), ("community",), epochs=4, warmup=1,
                                 log=lambda *a: None, rounds=2)
    assert {r["impl"]: r["peak_mem_bytes"] for r in rows if r["op"] == "epoch"} == {
        "fgplugin": 300 + 50 + 9, "cusparse-cached": 80 + 20}
    readings = iter([200, 260])
    rises = iter([12])
    (row, *_) = epoch.run_one(epoch.load("tiny", "cpu"), "cusparse-cached", epochs=2, hidden=8, warmup=1)
    assert row["peak_mem_bytes"] == 60 + 12  # one impl alone: the same definition


@CUDA
def test_epoch_peak_memory_is_recorded_in_rounds_on_cuda():
    """On CUDA every impl's peak memory is recorded in rounds mode too (all models alive), and a
    captured step (hooks of the first step's clock removed before the capture) is captured."""
    pytest.importorskip("torch_geometric")
    from fgplugin.bench import epoch

    rows = epoch.run_epoch_suite(["tiny"], ("fgplugin", "cusparse-cached", "cusparse-cached-graphed"),
                                 ("original", "community"), epochs=4, warmup=2, device="cuda", log=lambda *a: None,
                                 rounds=2)
    steps = [r for r in rows if r["op"] == "epoch"]
    assert len(steps) == 6 and all(r["peak_mem_bytes"] > 0 and not r.get("error") for r in steps), steps
    assert all(r["captured"] for r in steps if r["impl"] == "cusparse-cached-graphed")
    assert all(r["first_step_ms"] > 0 for r in rows if r["op"] == "preprocess")


def test_the_first_steps_lazy_work_counts_as_preprocessing(monkeypatch):
    """What a baseline builds on first use (here dgl-path's transposed CSR, slowed to 50 ms) runs in
    its first warm-up step: it is on the preprocess row (first_step_ms, first_use_ms) and in its
    ms_median, not in setup_ms; with no warm-up the first step is a timed one and none is recorded."""
    import time as clock
    from fgplugin.bench import epoch

    built, transposed = [], B.DGLPathGraph.transposed

    def slow_first_build(graph, dtype=torch.float32):
        if not built:
            clock.sleep(0.05)
            built.append(dtype)
        return transposed(graph, dtype)

    monkeypatch.setattr(B.DGLPathGraph, "transposed", slow_first_build)
    problem = epoch.load("tiny", "cpu")
    step, pre, _ = epoch.run_one(problem, "dgl-path", epochs=3, hidden=8, warmup=2)
    assert built and pre["first_step_ms"] >= 50 and pre["setup_ms"] < 50
    assert pre["first_use_ms"] == pytest.approx(max(pre["first_step_ms"] - step["ms_median"], 0.0))
    assert pre["ms_median"] == pytest.approx(pre["reorder_ms"] + pre["setup_ms"] + pre["first_use_ms"])
    _, pre, _ = epoch.run_one(problem, "dgl-path", epochs=2, hidden=8, warmup=0)
    assert "first_step_ms" not in pre and "first_use_ms" not in pre


def test_warm_up_clock_ends_with_the_optimizer_step_or_the_next_forward():
    """The clock's hooks time the steps asked for and remove themselves: at the optimizer's step,
    or, where the step had none (fp16's GradScaler skipping it), where the next forward starts."""
    from fgplugin.bench.epoch import WarmUpClock

    model = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    for skipped in (False, True):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        clock = WarmUpClock(torch.device("cpu"))
        clock.watch(model, optimizer)
        model(x).sum().backward()
        assert clock.seconds == []
        if not skipped:
            optimizer.step()
        model(x)  # the next step
        assert len(clock.seconds) == 1 and clock.seconds[0] > 0 and clock.rows_s == [0.0]
        assert not model._forward_pre_hooks and not optimizer._optimizer_step_post_hooks


def test_warm_up_clock_times_a_captured_steps_warm_up_and_never_runs_in_a_capture(monkeypatch):
    """For a captured step the clock times every warm-up step (the last is the eager step the
    first one is told apart from) and is gone before the capture; a hook that still finds itself
    inside a capture removes itself without syncing or recording."""
    from fgplugin.bench import epoch

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4)
    clock = epoch.WarmUpClock(torch.device("cpu"))
    clock.watch(model, optimizer, steps=3)
    for _ in range(4):
        model(x).sum().backward()
        optimizer.step()
    assert len(clock.seconds) == 3 and not model._forward_pre_hooks and not optimizer._optimizer_step_post_hooks

    clock = epoch.WarmUpClock(torch.device("cpu"))
    clock.watch(model, optimizer, steps=3)
    model(x).sum().backward()
    optimizer.step()
    synced = []
    monkeypatch.setattr(clock, "_sync", lambda: synced.append(1))
    monkeypatch.setattr(epoch, "_capturing", lambda: True)
    model(x).sum().backward()
    optimizer.step()
    assert len(clock.seconds) == 1 and not synced and not model._forward_pre_hooks


def test_warm_up_clock_ends_a_last_step_without_an_optimizer_step_when_closed():
    """fp16's GradScaler may skip the only warm-up step's optimizer step: closing the clock after
    the warm-up ends that step there, so it is recorded."""
    from fgplugin.bench.epoch import WarmUpClock

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    clock = WarmUpClock(torch.device("cpu"))
    clock.watch(model, optimizer)
    model(torch.randn(3, 4)).sum().backward()  # no optimizer step
    clock.close()
    assert len(clock.seconds) == 1 and clock.seconds[0] > 0 and not model._forward_pre_hooks


def test_a_captured_rows_first_use_is_told_from_an_eager_warm_up_step():
    """A captured row's median step is a replay: its first step's one-time work is the first
    warm-up step less the last one (eager), not less the median; off CUDA the captured impl runs
    its warm-up eagerly through graphed_step, which the clock times."""
    from fgplugin.bench import epoch

    problem = epoch.load("tiny", "cpu")
    run = epoch.ImplRun(problem, "cusparse-cached-graphed", 8, warmup=3)
    clock = run.warm_up_clock
    assert len(clock.seconds) == 3
    clock.seconds, clock.rows_s = [0.050, 0.004, 0.003], [0.0, 0.0, 0.0]
    assert run.first_use_s(median_ms=0.1) == pytest.approx(0.047)
    for timed_steps in ([0.050], [0.050, 0.004]):  # warmup 1 or 2: the second step builds the kept input
        clock.seconds, clock.rows_s = timed_steps, [0.0] * len(timed_steps)
        assert run.first_use_s(median_ms=0.1) is None
    eager = epoch.ImplRun(problem, "cusparse-cached", 8, warmup=3)
    eager.warm_up_clock.seconds, eager.warm_up_clock.rows_s = [0.050], [0.0]
    assert eager.first_use_s(median_ms=3.0) == pytest.approx(0.047)
