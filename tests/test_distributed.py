"""fgplugin.distributed on CPU (gloo): sharded training equals single-process training.

Ranks are separate processes (spawn) on localhost. Training runs in float64 with dropout 0, so the
only difference to the single-process run is the summation order of the SpMM; the bar of the
issue (final weights within 1e-4 relative) then holds with a wide margin, and resuming from a
checkpoint is compared exactly.
"""
import os
import socket
import time
import traceback
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fgplugin
from fgplugin import TiledAdjacency, grad_rows
from fgplugin.aggregation import Aggregation
from conftest import require_data_dir
from fgplugin.datasets import load_npz
from fgplugin.distributed import (DistGCN, DistributedTrainer, RankFailureError, ShardedGraph,
                                  ShardingContext, dist_spmm, relative_error)
from fgplugin.distributed.sharding import AUTO_SPARSE_MAX_SHARE
from fgplugin.reorder import reorder
from fgplugin.tile_density import DEFAULT_THRESHOLD

EPOCHS, LR, HIDDEN, SEED = 10, 0.01, 16, 0
DTYPE = torch.float64
TIMEOUT_S = 20  # collective timeout of the spawned groups


# ---------------------------------------------------------------------- harness
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, timeout_s, fn, args, queue):
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        queue.put((rank, "ok", fn(rank, world, *args)))
    except BaseException as err:  # report every failure to the parent, which asserts on it
        queue.put((rank, "error", (type(err).__name__, str(err), traceback.format_exc())))


def _launch(world, fn, *args, deadline_s=120, timeout_s=TIMEOUT_S):
    """Runs ``fn(rank, world, *args)`` in ``world`` processes; returns ``{rank: (status, result)}``."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        port = _free_port()
        procs = [ctx.Process(target=_entry, args=(r, world, port, timeout_s, fn, args, queue)) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = old
    results, end = {}, time.monotonic() + deadline_s
    while len(results) < world and time.monotonic() < end:
        if all(not p.is_alive() for p in procs) and queue.empty():
            break
        try:
            rank, status, value = queue.get(timeout=1.0)
            results[rank] = (status, value)
        except Exception:
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return results


def _ok(results, world):
    errors = {r: v[2] for r, (s, v) in results.items() if s != "ok"}
    assert not errors and len(results) == world, f"ranks failed or hung: {sorted(results)} reported; {errors}"
    return {r: v for r, (s, v) in results.items()}


# ---------------------------------------------------------------------- training on both sides
def _cora(path):
    return load_npz(path, features="dense")


def _model(data):
    torch.manual_seed(SEED)
    return DistGCN((data.num_features, HIDDEN, data.num_classes)).to(DTYPE)


def _reference(path):
    data = _cora(path)
    # float32 scales, as a ShardedGraph's (the kernels' type): then float64 runs agree to rounding.
    graph = Aggregation.of(TiledAdjacency.from_edge_index(data.edge_index, data.num_nodes), dtype=torch.float32)
    model = _model(data)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x, idx = data.x.to(DTYPE), data.train_mask.nonzero().squeeze(1)
    for _ in range(EPOCHS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(graph, x)[idx], data.y[idx])
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, float(loss.detach())


def _perm(n, kind):
    if kind == "random":
        return torch.randperm(n, generator=torch.Generator().manual_seed(1))
    return None


def _trainer(data, replication, comm, perm_kind, edge_index=None):
    ctx = ShardingContext(replication, comm=comm)
    ei = data.edge_index if edge_index is None else edge_index
    graph = ShardedGraph.from_edge_index(ctx, ei, data.num_nodes, perm=_perm(data.num_nodes, perm_kind))
    model = _model(data)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    trainer = DistributedTrainer(model, graph, graph.rows(data.x).to(DTYPE), graph.rows(data.y),
                                 graph.rows(data.train_mask), opt, val_mask=graph.rows(data.val_mask),
                                 test_mask=graph.rows(data.test_mask))
    return trainer


def _weights(trainer):
    return {k: v.detach().clone().numpy() for k, v in trainer.model.module.state_dict().items()}


def _odd_graph():
    """Directed, with self loops, duplicate edges and isolated nodes (ids 97..99)."""
    gen = torch.Generator().manual_seed(3)
    n = 100
    ei = torch.randint(0, n - 3, (2, 700), generator=gen)
    loops = torch.arange(0, n - 3, 7).repeat(2, 1)
    return torch.cat([ei, ei[:, :40], loops], dim=1), n


def _dense_reference(ei, n, norm):
    a = torch.zeros(n, n, dtype=DTYPE).index_put_((ei[1], ei[0]), torch.ones(ei.shape[1], dtype=DTYPE), accumulate=True)
    in_deg, out_deg = a.sum(1), a.sum(0)
    if norm == "gcn":
        fill = (a.diagonal() == 0).to(DTYPE)
        s = (in_deg + fill).rsqrt()
        s[torch.isinf(s)] = 0
        return s[:, None] * (a + torch.diag(fill)) * s[None, :]
    if norm == "mean":
        return a / in_deg.clamp(min=1)[:, None]
    if norm == "both":
        return in_deg.clamp(min=1).rsqrt()[:, None] * a * out_deg.clamp(min=1).rsqrt()[None, :]
    return a


def _output_and_input_grad(graph, h, weight):
    """This rank's rows of dist_spmm(graph, h) and of the gradient of sum(out * weight) in h
    (summed over the replicas, which hold partial gradients)."""
    h_local = graph.rows(h).requires_grad_()
    out = dist_spmm(graph, h_local)
    (out * graph.rows(weight)).sum().div(graph.ctx.replication).backward()
    grad = h_local.grad.clone()
    if graph.ctx.row_group is not None:
        dist.all_reduce(grad, group=graph.ctx.row_group)
    return out.detach(), grad


def _odd_graph_inputs(seed: int, width: int):
    """The odd graph directed and made symmetric ({kind: edge_index}), its node count, and seeded
    float64 features and output-gradient weights [n, width]."""
    ei, n = _odd_graph()
    gen = torch.Generator().manual_seed(seed)
    h, weight = (torch.randn(n, width, generator=gen, dtype=DTYPE) for _ in range(2))
    return {"directed": ei, "symmetric": torch.cat([ei, ei.flip(0)], dim=1)}, n, h, weight


def _spmm_cases(configs):
    """Forward and input gradient of dist_spmm against a dense float64 reference, on the directed
    odd graph (transposed backward) and on it made symmetric (the backward is the forward product
    where the row and column scales agree); with whether the graph took the symmetric path."""
    graphs, n, h, weight = _odd_graph_inputs(seed=4, width=5)
    errors = {}
    for kind, edges in graphs.items():
        for replication, comm, perm_kind in configs:
            for norm in ("gcn", "mean", "both", "none"):
                ctx = ShardingContext(replication, comm=comm)
                graph = ShardedGraph.from_edge_index(ctx, edges, n, perm=_perm(n, perm_kind), norm=norm)
                a = _dense_reference(edges, n, norm)
                out, grad = _output_and_input_grad(graph, h, weight)
                ids = graph.global_ids()
                errors[(kind, replication, comm, perm_kind, norm)] = (
                    relative_error(out, (a @ h)[ids]), relative_error(grad, (a.t() @ weight)[ids]),
                    graph.symmetric)
    return errors


def _bf16_wire_cases():
    """dist_spmm with bfloat16 on the wire (float32 features) against the float64 reference:
    {(graph kind, replication, comm): (forward error, input-gradient error, output dtype)}."""
    graphs, n, h, weight = _odd_graph_inputs(seed=5, width=12)
    errors = {}
    for kind, edges in graphs.items():
        a = _dense_reference(edges, n, "gcn")
        for replication, comm in ((1, "broadcast"), (1, "sparse"), (2, "broadcast"), (2, "sparse")):
            ctx = ShardingContext(replication, comm=comm, comm_dtype=torch.bfloat16)
            graph = ShardedGraph.from_edge_index(ctx, edges, n, perm=_perm(n, "random"))
            out, grad = _output_and_input_grad(graph, h.float(), weight.float())
            ids = graph.global_ids()
            errors[(kind, replication, comm)] = (relative_error(out.double(), (a @ h)[ids]),
                                                 relative_error(grad.double(), (a.t() @ weight)[ids]),
                                                 out.dtype, grad.dtype)
    return errors


def _read_share(edge_index, n, perm, q):
    """Share of the other blocks' rows that the q row blocks read (what comm="auto" decides on),
    computed here independently of fgplugin.distributed."""
    inv = torch.empty(n, dtype=torch.long)
    inv[perm] = torch.arange(n)
    src, dst = inv[edge_index[0]], inv[edge_index[1]]
    read = total = 0
    for g in range(q):
        s, e = g * n // q, (g + 1) * n // q
        srcs = src[(dst >= s) & (dst < e)]
        read += torch.unique(srcs[(srcs < s) | (srcs >= e)]).numel()
        total += n - (e - s)
    return read / total


def _auto_choices(path):
    """{perm kind: (the mode comm="auto" chose, the read share)} on cora in 1D: randomly
    numbered nodes, and community order, whose row blocks cut few edges."""
    data = _cora(path)
    n, out = data.num_nodes, {}
    for kind, perm in (("random", _perm(n, "random")), ("community", reorder(data.edge_index, "community", num_nodes=n))):
        graph = ShardedGraph.from_edge_index(ShardingContext(1), data.edge_index, n, perm=perm)
        out[kind] = (graph.comm, _read_share(data.edge_index, n, perm, dist.get_world_size()))
    return out


def _live_row_cases():
    """Backward products of dist_spmm on the symmetric odd graph for output gradients that are
    zero outside a set of rows (as a masked loss makes them), against the dense float64 reference:
    {case: ([input-gradient error per call], exchange stats, own block's grad_rows stats)}. The
    calls' row sets: A, A, B, A, C, D, E, F, so the exchange builds, reuses, keeps two (A and B),
    evicts the oldest past MAX_KEPT, and after MAX_MISSES new sets in a row goes back to the full
    exchange. Also: ranks with different grad_rows thresholds refuse to build a graph; a double
    backward through dist_spmm fails instead of being wrong. Needs MIN_WORK = 0."""
    graphs, n, h, weight = _odd_graph_inputs(seed=6, width=8)
    edges = graphs["symmetric"]
    a = _dense_reference(edges, n, "gcn")
    gen = torch.Generator().manual_seed(7)
    row_sets = [torch.randperm(n, generator=gen)[:20] for _ in range(6)]
    order = [0, 0, 1, 0, 2, 3, 4, 5]
    cases = {}
    for replication, comm, wire in ((1, "broadcast", None), (2, "broadcast", None), (1, "sparse", None),
                                    (2, "sparse", None), (1, "broadcast", torch.bfloat16),
                                    (2, "broadcast", torch.bfloat16), (1, "sparse", torch.bfloat16)):
        ctx = ShardingContext(replication, comm=comm, comm_dtype=wire)
        graph = ShardedGraph.from_edge_index(ctx, edges, n, perm=_perm(n, "random"))
        errors = []
        for i in order:
            masked = torch.zeros_like(weight)
            masked[row_sets[i]] = weight[row_sets[i]]
            x = h if wire is None else h.float()
            _, grad = _output_and_input_grad(graph, x, masked.to(x.dtype))
            errors.append(relative_error(grad.double(), (a.t() @ masked)[graph.global_ids()]))
        own = graph.blocks.get(ctx.block)
        own_stats = None if own is None else grad_rows.stats(own.adj.col)
        cases[(replication, comm, wire)] = (errors, graph.live_rows.stats(), own_stats)
    # One rank with the skipping off: every rank must fall back to the full exchange together.
    previous = fgplugin.set_row_skipping(dist.get_rank() != 1)
    try:
        graph = ShardedGraph.from_edge_index(ShardingContext(1, comm="broadcast"), edges, n, perm=_perm(n, "random"))
        masked = torch.zeros_like(weight)
        masked[row_sets[0]] = weight[row_sets[0]]
        _, grad = _output_and_input_grad(graph, h, masked)
        cases["one rank off"] = ([relative_error(grad, (a.t() @ masked)[graph.global_ids()])],
                                 graph.live_rows.stats(), None)
    finally:
        fgplugin.set_row_skipping(previous)
    previous = grad_rows.MIN_WORK
    grad_rows.MIN_WORK = {"cuda": 0, "cpu": 1 if dist.get_rank() == 1 else 0}
    try:
        ShardedGraph.from_edge_index(ShardingContext(1), edges, n)
        cases["thresholds differ"] = None
    except ValueError as err:
        cases["thresholds differ"] = str(err)
    finally:
        grad_rows.MIN_WORK = previous
    graph = ShardedGraph.from_edge_index(ShardingContext(1, comm="broadcast"), edges, n)
    h_local = graph.rows(h).requires_grad_()
    out = dist_spmm(graph, h_local)
    (first,) = torch.autograd.grad((out * out).sum(), h_local, create_graph=True)
    try:
        (first * first).sum().backward()
        cases["double backward"] = None
    except RuntimeError as err:
        cases["double backward"] = str(err)
    return cases


def _four_ranks(rank, world, path, configs, tmpdir):
    # Cora and the odd graph are far below the work at which the zero-row skipping pays; here it
    # runs on them so that training and _live_row_cases exercise it (the dense-gradient cases
    # still take the full products: their rows are all live).
    grad_rows.MIN_WORK = {"cuda": 0, "cpu": 0}
    return {"spmm": _spmm_cases(configs), "train": _train_configs(path, configs, tmpdir),
            "auto": _auto_choices(path), "bf16": _bf16_wire_cases(), "live_rows": _live_row_cases()}


def _train_each(data, configs, evaluate):
    """{config: (final weights, final loss, accuracies or None, stats of the zero-row skipping
    (exchange, own block), the blocks' thresholds)} after EPOCHS epochs of each config."""
    out = {}
    for replication, comm, perm_kind in configs:
        trainer = _trainer(data, replication, comm, perm_kind)
        for _ in range(EPOCHS):
            stats = trainer.step()
        graph = trainer.graph
        own = graph.blocks.get(graph.ctx.block)
        skipping = graph.live_rows.stats(), None if own is None else grad_rows.stats(own.adj.col)
        accuracies = trainer.evaluate() if evaluate else None
        thresholds = {b.adj.threshold for b in graph._all_blocks()}
        out[(replication, comm, perm_kind)] = (_weights(trainer), stats["loss"], accuracies, skipping, thresholds)
    return out


def _train_configs(path, configs, tmpdir):
    data = _cora(path)
    out = _train_each(data, configs, evaluate=True)
    # Checkpoint: 5 epochs, save, resume in a fresh trainer (other sharding too), 5 more.
    ckpt = os.path.join(tmpdir, "ckpt.pt")
    trainer = _trainer(data, configs[-1][0], configs[-1][1], "random")
    for _ in range(EPOCHS // 2):
        trainer.step()
    trainer.save_checkpoint(ckpt)
    for replication, comm in ((configs[-1][0], configs[-1][1]), (1, "broadcast")):
        resumed = _trainer(data, replication, comm, None)
        torch.nn.init.normal_(resumed.model.module.weights[0])  # must be overwritten by the checkpoint
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = resumed.load_checkpoint(ckpt)
        # the random states come back only with the sharding that wrote them (here the node order
        # differs: written with a random one)
        out[("warned", replication, comm)] = any("random states are not restored" in str(w.message) for w in caught)
        assert start == EPOCHS // 2
        while resumed.epoch < EPOCHS:
            resumed.step()
        out[("resumed", replication, comm)] = _weights(resumed)
    # Machines without a shared file system: only rank 0 has the file, and it decides for all.
    rank = trainer.graph.ctx.rank
    own_folder = os.path.join(tmpdir, f"node{rank}")
    os.makedirs(own_folder, exist_ok=True)
    trainer.save_checkpoint(os.path.join(own_folder, "ckpt.pt"))
    assert os.path.exists(os.path.join(own_folder, "ckpt.pt")) == (rank == 0)
    fresh = _trainer(data, configs[-1][0], configs[-1][1], None)
    assert fresh.load_checkpoint(os.path.join(own_folder, "ckpt.pt"), missing_ok=True) == EPOCHS // 2
    assert fresh.load_checkpoint(os.path.join(tmpdir, "absent.pt"), missing_ok=True) is None
    with pytest.raises(FileNotFoundError, match="no checkpoint there on rank 0"):
        fresh.load_checkpoint(os.path.join(tmpdir, "absent.pt"))
    return out


def _check_equal(ranks, reference, reference_loss, keys):
    for rank, out in ranks.items():
        for key in keys:
            weights, loss, *_ = out[key]
            for name, ref in reference.items():
                err = relative_error(torch.from_numpy(weights[name]), ref)
                assert err < 1e-4, f"rank {rank} {key}: {name} differs from single-process training by {err:.2e}"
                assert err < 1e-9, f"float64 run should agree to rounding: rank {rank} {key} {name} {err:.2e}"
            assert loss == pytest.approx(reference_loss, rel=1e-9)
        first = out[keys[0]][0]
        for key in keys[1:]:  # replicas and schemes agree with each other too
            for name in first:
                assert relative_error(torch.from_numpy(out[key][0][name]), torch.from_numpy(first[name])) < 1e-9


@pytest.fixture(scope="module")
def cora_path():
    return str(require_data_dir() / "cora.npz")


@pytest.fixture(scope="module")
def reference(cora_path):
    return _reference(cora_path)


CONFIGS = [(1, "broadcast", "random"), (1, "sparse", "random"), (2, "broadcast", None), (2, "sparse", "random")]


@pytest.fixture(scope="module")
def four_ranks(cora_path, tmp_path_factory):
    """One 4-process run (1D and 1.5D r=2, both exchange modes) shared by the tests below."""
    return _ok(_launch(4, _four_ranks, cora_path, CONFIGS, str(tmp_path_factory.mktemp("ckpt"))), 4)


def _output_and_grads(model, graph, x):
    """The model's output and its parameters' gradients for a fixed, uneven output weighting."""
    model.zero_grad()
    out = model(graph, x)
    (out * torch.arange(out.numel()).view_as(out).remainder(5)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("bias", [True, False])
def test_dist_gcn_pads_the_weight_not_the_features(bias, monkeypatch):
    """Where the SpMM wants wider rows (on CUDA 6 -> 8 columns at fp32), DistGCN pads W, so the
    SpMM runs on H W as it comes; forced here on the CPU: the SpMM sees 8 columns, and outputs and
    gradients equal those of the unpadded model."""
    from fgplugin import aggregation
    from fgplugin.distributed import train
    from fgplugin.testing import random_graph_case, record_spmm_widths, rel_error

    case = random_graph_case(4, n_src=300, avg_degree=6)
    graph = Aggregation.of(TiledAdjacency.from_edge_index(case.edge_index, case.num_nodes))
    torch.manual_seed(0)
    model = DistGCN((16, 10, 6), bias=bias)
    x = torch.randn(case.num_nodes, 16)

    monkeypatch.setattr(fgplugin.config.settings, "input_cache", False)  # layer 1 aggregates x W every call, padded
    plain, plain_grads = _output_and_grads(model, graph, x)
    widths = record_spmm_widths(monkeypatch)
    monkeypatch.setattr(aggregation, "padded_width", lambda features, dtype, device, nnz=None: features + -features % 4)
    padded, padded_grads = _output_and_grads(model, graph, x)
    assert 8 in widths and 12 in widths  # both layers' products ran on padded widths (10 -> 12, 6 -> 8)
    assert padded.is_contiguous() and rel_error(padded, plain) <= 1e-5
    for g_padded, g_plain in zip(padded_grads, plain_grads):
        assert rel_error(g_padded, g_plain) <= 1e-5


def test_auto_comm_picks_sparse_only_when_few_rows_are_read(four_ranks):
    for rank, out in four_ranks.items():
        choices = out["auto"]
        assert ShardingContext.__init__.__kwdefaults__["comm"] == "auto"
        for kind, (comm, share) in choices.items():
            assert comm == ("sparse" if share <= AUTO_SPARSE_MAX_SHARE else "broadcast"), (rank, kind, comm, share)
        # Both branches are taken: random ids make every block read most of the others' rows.
        assert choices["random"][0] == "broadcast" and choices["community"][0] == "sparse", (rank, choices)


def test_dist_spmm_matches_dense_reference(four_ranks):
    for rank, out in four_ranks.items():
        for key, (fwd, bwd, symmetric) in out["spmm"].items():
            # The scales are float32 (as fgplugin's own normalization): float32 rounding, not float64.
            assert fwd < 1e-6 and bwd < 1e-6, f"rank {rank} {key}: forward {fwd:.1e}, input gradient {bwd:.1e}"
            # "mean" scales rows only, so even a symmetric graph's normalized matrix is not symmetric.
            assert symmetric == (key[0] == "symmetric" and key[-1] != "mean"), (rank, key, symmetric)


def test_bf16_wire_rounds_only_to_bf16(four_ranks):
    """comm_dtype=bfloat16: the received rows travel and are multiplied in bf16 (the remote part of
    the sum is rounded to bf16 too); the result comes back in float32, within bf16's error bar of
    the exact product and clearly not exact (so the wire really is bf16)."""
    for rank, out in four_ranks.items():
        for key, (fwd, bwd, out_dtype, grad_dtype) in out["bf16"].items():
            assert out_dtype == grad_dtype == torch.float32, (rank, key, out_dtype, grad_dtype)
            assert 1e-5 < fwd < 2e-2 and 1e-5 < bwd < 2e-2, f"rank {rank} {key}: forward {fwd:.1e}, gradient {bwd:.1e}"


def test_four_ranks_1d_and_15d_match_single_process(four_ranks, reference):
    configs = CONFIGS
    ranks = {r: v["train"] for r, v in four_ranks.items()}
    ref, ref_loss = reference
    _check_equal(ranks, ref, ref_loss, configs)
    # The training gradient is zero outside the training rows, and the backward exchange sent only
    # those: the first epoch has two backward products (the first layer's input aggregation is
    # kept from the second call on), each with its own rows, so it built for layer 2 and layer 1,
    # then reused layer 2's every later epoch; layer 1's, unused, was dropped (STALE_USES).
    for rank, out in ranks.items():
        for config in configs:
            exchange, own = out[config][3]
            assert (exchange["builds"], exchange["hits"], exchange["kept"]) == (2, EPOCHS - 1, 1), \
                (rank, config, exchange)
            assert exchange["live_rows"] == 140  # cora's training nodes
            assert own is None or own["hits"] >= EPOCHS - 1, (rank, config, own)
            # Several row blocks keep the fixed threshold (sharding.py says why).
            assert out[config][4] == {DEFAULT_THRESHOLD}, (rank, config, out[config][4])
    accs = ranks[0][configs[0]][2]
    assert set(accs) == {"train_acc", "val_acc", "test_acc"} and accs["train_acc"] > 0.5
    for rank, out in ranks.items():  # resumed after 5 epochs == 10 straight epochs
        assert out[("warned", 2, "sparse")] and out[("warned", 1, "broadcast")], rank
        straight = out[configs[-1]][0]
        for key in (("resumed", 2, "sparse"), ("resumed", 1, "broadcast")):
            for name in straight:
                err = relative_error(torch.from_numpy(out[key][name]), torch.from_numpy(straight[name]))
                assert err < 1e-9, f"rank {rank}: resumed run {key} differs in {name} by {err:.2e}"


def test_backward_sends_only_the_live_rows(four_ranks):
    """Output gradients zero outside 20 of 100 rows: both exchange modes move only those rows, in
    1D and 1.5D, and every backward product equals the dense reference, through builds, reuse,
    rebuilds and the fallback to the full exchange; bf16 on the wire keeps bf16's error bar."""
    for rank, out in four_ranks.items():
        cases = out["live_rows"]
        assert "grad_rows.MIN_WORK" in (cases.pop("thresholds differ") or ""), rank
        assert "once_differentiable" in (cases.pop("double backward") or ""), rank
        for key, (errors, exchange, own) in cases.items():
            bar = 2e-2 if key[-1] == torch.bfloat16 else 1e-6
            assert len(errors) and all(e < bar for e in errors), f"rank {rank} {key}: errors {errors}"
            if key == "one rank off":
                assert exchange["builds"] == 0, "a rank with the skipping off must turn it off for all"
                continue
            # Row sets A, A, B, A, C, D, E, F: built for A, reused, built for B, A reused (both
            # kept), built for C, D and E (B evicted: MAX_KEPT = 3; MAX_MISSES = 3 new sets in a
            # row), then the full exchange for F.
            assert (grad_rows.MAX_KEPT, grad_rows.MAX_MISSES) == (3, 3)
            assert (exchange["builds"], exchange["hits"], exchange["misses"], exchange["kept"]) == (5, 2, 3, 3), \
                (rank, key, exchange)
            # The own block's product left out the zero rows too (the rank's own, in 1.5D when it
            # multiplies its own block).
            assert own is None or own["builds"] == 5, (rank, key, own)


def _refusal(data, edge_index, perm_kind=None):
    try:
        _trainer(data, 1, "sparse", perm_kind, edge_index=edge_index)
    except ValueError as err:
        return str(err)
    return None


def _disagree_then_train(rank, world, path):
    data = _cora(path)
    edge_index = data.edge_index if rank == 0 else data.edge_index[:, 1:]  # rank 1 lost an edge
    lost_edge = _refusal(data, edge_index)
    # Rank 1 rewired two edges, keeping every degree and the edge count: two edges swap targets.
    rewired = data.edge_index.clone()
    if rank == 1:
        rewired[1, 0], rewired[1, 100] = data.edge_index[1, 100], data.edge_index[1, 0]
    swapped_targets = _refusal(data, rewired)
    # The group is still usable after the refusals: train on agreeing input.
    trainer = _trainer(data, 1, "sparse", "random")
    for _ in range(EPOCHS):
        stats = trainer.step()
    return (lost_edge, swapped_targets), (_weights(trainer), stats["loss"], None)


def test_two_ranks_refuse_different_graphs_then_match(cora_path, reference):
    ranks = _ok(_launch(2, _disagree_then_train, cora_path), 2)
    for rank, ((lost_edge, swapped_targets), _) in ranks.items():
        assert lost_edge is not None and "different graphs" in lost_edge and "num_edges" in lost_edge, (rank, lost_edge)
        assert swapped_targets is not None and "edge hash" in swapped_targets, (rank, swapped_targets)
        assert "num_edges" not in swapped_targets, (rank, swapped_targets)
    ref, ref_loss = reference
    _check_equal({r: {"p2": v[1]} for r, v in ranks.items()}, ref, ref_loss, ["p2"])


def _dropout_trainer(data):
    trainer = _trainer(data, 1, "broadcast", "random")
    trainer.model.module.dropout = 0.5
    return trainer


class _OnAdjacency(torch.nn.Module):
    """A user's model of drop-in layers, called ``(graph, x)`` as DistributedTrainer calls it."""

    def __init__(self, data):
        super().__init__()
        from fgplugin.pyg import GCNConv

        torch.manual_seed(SEED)
        self.conv = GCNConv(data.num_features, data.num_classes).to(DTYPE)

    def forward(self, graph, x):
        return self.conv(x, graph)


def _checkpoint_cases(rank, world, path, tmpdir):
    from fgplugin.distributed import ShardedAdjacency

    from fgplugin.distributed.train import _rng_state

    data = _cora(path)
    os.umask(0o022)  # the checkpoint's mode follows the umask, as torch.save's would
    out = {}
    # With dropout, a resumed run draws the masks an uninterrupted one draws (the random states).
    straight = _dropout_trainer(data)
    for _ in range(EPOCHS):
        straight.step()
    first = _dropout_trainer(data)
    for _ in range(EPOCHS // 2):
        first.step()
    ckpt = os.path.join(tmpdir, "dropout.pt")
    first.save_checkpoint(ckpt)
    torch.manual_seed(1234)  # whatever the new process drew since, the checkpoint's states rule
    resumed = _dropout_trainer(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # same number of ranks: no warning
        resumed.load_checkpoint(ckpt)
    while resumed.epoch < EPOCHS:
        resumed.step()
    out["dropout"] = (_weights(straight), _weights(resumed))
    # Rank 0 cannot write: every rank raises at once, and no temporary file is left.
    start = time.monotonic()
    try:
        first.save_checkpoint(os.path.join(tmpdir, "absent", "ckpt.pt"))
        out["unwritable"] = None
    except Exception as err:  # noqa: BLE001
        out["unwritable"] = (type(err).__name__, str(err), time.monotonic() - start)
    out["left"] = sorted(os.listdir(tmpdir))
    # A user model on a ShardedAdjacency checkpoints and resumes too.
    adjacency = ShardedAdjacency(ShardingContext(1), data.edge_index, data.num_nodes)
    rows = adjacency.base.rows
    model = _OnAdjacency(data)
    on_adjacency = DistributedTrainer(model, adjacency, rows(data.x).to(DTYPE), rows(data.y), rows(data.train_mask),
                                      torch.optim.Adam(model.parameters(), lr=LR))
    on_adjacency.step()
    saved = _weights(on_adjacency)
    on_adjacency.save_checkpoint(os.path.join(tmpdir, "adjacency.pt"))
    out["mode"] = os.stat(os.path.join(tmpdir, "adjacency.pt")).st_mode & 0o777
    on_adjacency.step()
    out["adjacency"] = (on_adjacency.load_checkpoint(os.path.join(tmpdir, "adjacency.pt")),
                        all((saved[k] == v).all() for k, v in _weights(on_adjacency).items()))
    # Files that are not checkpoints of this graph (a damaged one must not load on some ranks only),
    # and ones of the first format.
    good = {**first.state_dict(), "rng": [_rng_state(torch.device("cpu"))] * world, "sharding": first._sharding}
    old_format = {**first.state_dict(), "format": 1, "graph": first.state_dict()["graph"][:2] + [7, 7]}
    cases = {"list": [1, 2], "no graph": {"format": 2, "epoch": 1, "model": {}, "optimizer": {}},
             "short rng": {**good, "rng": good["rng"][:1]}, "graph not a list": {**good, "graph": 5},
             "format 1": old_format,
             "format 1, other graph": {**old_format, "graph": [old_format["graph"][0] + 1] + old_format["graph"][1:]}}
    for name, state in cases.items():
        bad = os.path.join(tmpdir, f"{name}.pt")
        if rank == 0:
            torch.save(state, bad)
        dist.barrier()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out[name] = ("loaded", first.load_checkpoint(bad), [str(w.message) for w in caught])
            except ValueError as err:
                out[name] = ("ValueError", str(err))
    return out


def test_checkpoints_resume_dropout_refuse_bad_files_and_fail_together(cora_path, tmp_path):
    ranks = _ok(_launch(2, _checkpoint_cases, cora_path, str(tmp_path)), 2)
    for rank, out in ranks.items():
        straight, resumed = out["dropout"]
        for name in straight:
            assert relative_error(torch.from_numpy(resumed[name]), torch.from_numpy(straight[name])) < 1e-12, (rank, name)
        kind, message, seconds = out["unwritable"]
        assert kind in ("FileNotFoundError", "RuntimeError") and "ckpt.pt" in message and seconds < TIMEOUT_S / 2, \
            (rank, out["unwritable"])
        if rank:
            assert "rank 0" in message and "nothing was saved" in message, message
        assert out["adjacency"] == (1, True) and out["mode"] == 0o644, out
        for damaged in ("short rng", "graph not a list"):
            assert out[damaged][0] == "ValueError" and "damaged" in out[damaged][1], (damaged, out[damaged])
        assert out["format 1, other graph"][0] == "ValueError" and "another graph" in out["format 1, other graph"][1]
        assert out["list"] == ("ValueError", out["list"][1]) and "not an fgplugin.distributed checkpoint (a list)" \
            in out["list"][1], out["list"]
        assert out["no graph"][0] == "ValueError" and "without graph" in out["no graph"][1], out["no graph"]
        loaded, epoch, caught = out["format 1"]
        assert loaded == "loaded" and epoch == EPOCHS // 2 and any("random states are not restored" in w for w in caught)
    assert not [name for name in ranks[0]["left"] if "tmp" in name], ranks[0]["left"]


def _block_thresholds(rank, world, path):
    data = _cora(path)
    defaults = ShardedGraph.from_edge_index(ShardingContext(1), data.edge_index, data.num_nodes)
    given = ShardedGraph.from_edge_index(ShardingContext(1), data.edge_index, data.num_nodes, threshold=0.1)
    with pytest.raises(ValueError, match="threshold"):
        ShardedGraph.from_edge_index(ShardingContext(1), data.edge_index, data.num_nodes, threshold=1.5)
    return [{b.adj.threshold for b in g._all_blocks()} for g in (defaults, given)]


def test_one_rank_blocks_default_to_auto(cora_path):
    """On one rank nothing overlaps the block's product, so its default is "auto" (the probe on a
    GPU, as any TiledAdjacency's; several ranks keep the fixed threshold:
    test_four_ranks_1d_and_15d_...); a threshold given is used as given, and a bad one refused."""
    (defaults, given), = _ok(_launch(1, _block_thresholds, cora_path), 1).values()
    assert defaults == {"auto"} and given == {0.1}


def _one_rank_dies(rank, world, path):
    data = _cora(path)
    trainer = _trainer(data, 1, "sparse", "random")
    for epoch in range(EPOCHS):
        if rank == world - 1 and epoch == 2:
            os._exit(3)  # simulate a crash: no cleanup, sockets close
        trainer.step()
    return "finished"


def test_dead_rank_gives_clear_error_not_hang(cora_path):
    start = time.monotonic()
    results = _launch(3, _one_rank_dies, cora_path, deadline_s=TIMEOUT_S + 60)
    elapsed = time.monotonic() - start
    assert 2 not in results
    for rank in (0, 1):
        assert rank in results, f"rank {rank} hung (no result after {elapsed:.0f} s)"
        status, value = results[rank]
        assert status == "error" and value[0] == RankFailureError.__name__, value
        assert "another rank died" in value[1] and f"time out after {TIMEOUT_S} s" in value[1], value[1]
    assert elapsed < TIMEOUT_S + 60


def test_distributed_example_trains_under_torchrun(tmp_path):
    """The README's distributed example as users launch it (torchrun, here 2 gloo ranks on CPU) on
    the graph it generates by default: it trains to a useful accuracy, saves a checkpoint at the
    end (fewer epochs than --save-every), resumes from it with the right epoch count, and every
    rank exits cleanly."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "distributed_gcn.py"
    checkpoint = tmp_path / "ckpt.pt"

    def run(epochs):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(example),
               "--backend", "gloo", "--epochs", str(epochs), "--timeout", "60", "--checkpoint", str(checkpoint)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return done.stdout

    first = run(20)
    assert "epochs 1-20 (20 run here)" in first and "on 2 ranks" in first and checkpoint.is_file(), first
    assert float(re.findall(r"test_acc ([0-9.]+)", first)[-1]) > 0.8, first
    resumed = run(30)
    assert "resumed from" in resumed and "at epoch 20" in resumed, resumed
    assert "epochs 21-30 (10 run here)" in resumed, resumed
    assert re.findall(r"epoch +(\d+) ", resumed) == ["30"], resumed


def test_a_sharding_context_does_not_keep_its_process_group_past_destroy():
    """A process group that outlives destroy_process_group() is destroyed at interpreter exit,
    where gloo aborts the process about once in three 2-rank runs ("terminate called without an
    active exception"): the context holds its groups weakly, so destroying them frees them, and
    using the context afterwards says what happened."""
    import gc
    import weakref

    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    ctx = ShardingContext()
    group = weakref.ref(ctx.col_group)
    dist.destroy_process_group()
    gc.collect()
    assert group() is None
    with pytest.raises(RuntimeError, match="process group of this ShardingContext was destroyed"):
        ctx.col_group


_TRAIN_THEN_DESTROY = """
import gc, weakref, torch, torch.distributed as dist
from fgplugin.distributed import DistGCN, DistributedTrainer, ShardedGraph, ShardingContext
from fgplugin.datasets import community_graph
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
world = weakref.ref(dist.group.WORLD)
data = community_graph("tiny", seed=0)
graph = ShardedGraph.from_edge_index(ShardingContext(), data.edge_index, data.num_nodes)
model = DistGCN((data.x.shape[1], 8, data.num_classes))
trainer = DistributedTrainer(model, graph, graph.rows(data.x), graph.rows(data.y), graph.rows(data.train_mask),
                             torch.optim.Adam(model.parameters(), lr=0.01))
trainer.step()
dist.destroy_process_group()
gc.collect()
print("group alive after destroy:", world() is not None)
"""


def test_training_does_not_keep_the_default_group_past_destroy():
    """An optimizer imports torch._dynamo, which imports torch.distributed.nn.functional; if that
    happens after init_process_group, its ``group=group.WORLD`` defaults keep the default group
    alive until interpreter exit (where gloo can abort). fgplugin.distributed imports it first.
    A fresh interpreter, so that nothing imported it before."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TRAIN_THEN_DESTROY.format(port=_free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "group alive after destroy: False" in done.stdout, done.stdout + done.stderr[-3000:]


def test_replication_must_fit_world(cora_path):
    # Pure argument checks: they need an initialized group; one process suffices.
    port = _free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="r <= p/r"):
            ShardingContext(replication=2)
        with pytest.raises(ValueError, match="comm must be"):
            ShardingContext(comm="allgather")
    finally:
        dist.destroy_process_group()


def _train_only(rank, world, path, configs):
    return _train_each(_cora(path), configs, evaluate=False)


def test_eight_ranks_1d_and_15d_match_single_process(cora_path, reference):
    """1D p=8 and 1.5D p=8 r=2 (4 row blocks) against single-process training, on CPUs."""
    configs = [(1, "sparse", "random"), (2, "sparse", "random")]
    ranks = _ok(_launch(8, _train_only, cora_path, configs, deadline_s=300), 8)
    _check_equal(ranks, *reference, configs)


# ---------------------------------------------------------------------- scaling benchmark
def _scaling_graph_rank(rank, world):
    """The scaling suite's _graph (fgplugin.bench.scaling) with rank 1's generator made to drop an edge."""
    import types

    import fgplugin.datasets
    from fgplugin.bench import scaling

    generate = fgplugin.datasets.community_graph

    def flaky(*args, **kwargs):
        data = generate(*args, **kwargs)
        if rank == 1:
            data.edge_index = data.edge_index[:, 1:].contiguous()
        return data

    fgplugin.datasets.community_graph = flaky
    data = scaling._graph("small", types.SimpleNamespace(quick=True, seed=0), torch.device("cpu"))
    reference = generate("small", seed=0)
    return (data.meta["generator_disagreed"], torch.equal(data.edge_index, reference.edge_index),
            torch.equal(data.x, reference.x))


def test_scaling_benchmark_takes_rank0_graph():
    """A rank whose generator disagrees is reported and gets rank 0's graph (archaea-like once
    differed on one of four H200s)."""
    results = _launch(2, _scaling_graph_rank)
    for rank in range(2):
        status, value = results[rank]
        assert status == "ok", value
        assert value == ([1], True, True)


def test_dist_gcn_keeps_the_first_layers_input_aggregation(monkeypatch):
    """From the second call on, DistGCN's first layer reuses A x (fgplugin.input_cache): one
    aggregation per step instead of two, with the outputs and gradients of the plain model."""
    from fgplugin import input_cache
    from fgplugin.testing import random_graph_case, rel_error

    case = random_graph_case(5, n_src=300, avg_degree=6)
    adj = TiledAdjacency.from_edge_index(case.edge_index, case.num_nodes)
    calls = []

    class Counting(Aggregation):
        def __call__(self, h):
            calls.append(h.shape[1])
            return super().__call__(h)

    graph = Counting(*Aggregation.of(adj))
    torch.manual_seed(0)
    model = DistGCN((16, 10, 6))
    x = torch.randn(case.num_nodes, 16)

    monkeypatch.setattr(fgplugin.config.settings, "input_cache", False)
    plain, plain_grads = _output_and_grads(model, graph, x)
    monkeypatch.setattr(fgplugin.config.settings, "input_cache", True)
    for _ in range(3):
        calls.clear()
        kept, kept_grads = _output_and_grads(model, graph, x)
    assert calls == [6]  # only the second layer aggregates (x W -> 10 -> 6 columns)
    assert input_cache.of(model).holds
    assert rel_error(kept, plain) <= 1e-5
    for g_kept, g_plain in zip(kept_grads, plain_grads):
        assert rel_error(g_kept, g_plain) <= 1e-5
