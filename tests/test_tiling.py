"""TiledAdjacency: construction, tile plan, transpose, devices, pickling and input validation."""
import io
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fgplugin
from fgplugin import TiledAdjacency
from fgplugin._csr import index_dtype_for
from fgplugin.preprocess import reorder_graph
from fgplugin.testing import dense_spmm, graph_cases, rel_error

CASES = {case.name: case for case in graph_cases()}


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.name)
def test_csr_holds_the_edges(case):
    adj = case.adjacency()
    assert adj.shape == case.shape
    rows = torch.repeat_interleave(torch.arange(adj.shape[0]), adj.rowptr.diff().long())
    dense = torch.zeros(case.shape, dtype=torch.float64)
    weights = torch.ones(adj.nnz, dtype=torch.float64) if adj.values is None else adj.values.double()
    dense.index_put_((rows, adj.col.long()), weights, accumulate=True)
    assert torch.equal(dense, case.dense())
    order = rows * max(adj.shape[1], 1) + adj.col.long()
    assert bool((order[1:] >= order[:-1]).all()), "columns sorted within rows"
    if case.edge_weight is not None:
        assert torch.equal(adj.values, case.edge_weight[adj.edge_perm.long()])


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.name)
def test_tile_plan_matches_brute_force_count(case):
    adj = case.adjacency()
    plan = adj.tiles
    t = plan.tile_size
    counts = {}
    for src, dst in case.edge_index.t().tolist():
        counts[(dst // t, src // t)] = counts.get((dst // t, src // t), 0) + 1
    dense = sorted(k for k, v in counts.items() if v > plan.threshold * t * t)
    panels = plan.panel_ptr.long()
    got = [(p, int(c)) for p in range(panels.numel() - 1) for c in plan.tile_col[panels[p]:panels[p + 1]]]
    assert got == dense
    assert plan.nnz_dense == sum(counts[k] for k in dense)
    assert plan.tile_nnz.tolist() == [counts[k] for k in dense]


def test_tile_exactly_at_threshold_is_sparse():
    adj = CASES["tile_at_threshold"].adjacency()
    assert adj.tiles.tile_col.tolist() == [1] and adj.tiles.panel_ptr.tolist() == [0, 0, 1, 1]
    assert adj.tiles.tile_nnz.tolist() == [53]


def test_auto_threshold_option():
    """threshold="auto" is accepted everywhere a threshold is; off the GPU (where nothing can be
    timed, and for the host-side statistics until a probe ran) it resolves to the default 5%; it
    survives pickling; other strings are refused."""
    adj = CASES["dense_block"].adjacency()
    auto = adj.with_tiles(threshold="auto")
    assert auto.threshold == "auto" and "dense above auto (5% until probed)" in repr(auto)
    assert auto.resolved_threshold(torch.float32) == auto.tiles.threshold == 0.05
    assert auto.kernel_plan(torch.float32) is None  # no block-adaptive kernel on the CPU
    assert auto.tiles.tile_col.tolist() == adj.with_tiles(threshold=0.05).tiles.tile_col.tolist()
    buffer = io.BytesIO()
    torch.save(auto, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True).threshold == "auto"
    x = torch.randn(adj.shape[1], 5)
    assert torch.equal(fgplugin.spmm(auto, x), fgplugin.spmm(adj, x))
    with pytest.raises(ValueError, match='or "auto"'):
        adj.with_tiles(threshold="fast")


def test_with_tiles_reclassifies():
    adj = CASES["dense_block"].adjacency()
    assert adj.with_tiles(threshold=0.5).tiles.tile_col.tolist() == [1]  # the full 32x32 block only
    assert adj.with_tiles(threshold=0.0).tiles.num_dense_tiles == 16  # every non-empty tile
    assert adj.with_tiles(tile_size=16).tiles.tile_size == 16
    assert adj.tiles.num_dense_tiles >= 1


def test_transpose_symmetric_shares_arrays_and_asymmetric_is_correct():
    ring = torch.tensor([[0, 1, 1, 2, 2, 0], [1, 0, 2, 1, 0, 2]])
    adj = TiledAdjacency.from_edge_index(ring, 3)
    t_rowptr, t_col, _ = adj.transpose()
    assert t_rowptr is adj.rowptr and t_col is adj.col
    case = CASES["bipartite_wide_signed_weights"]
    adj = case.adjacency()
    t_rowptr, t_col, t_perm = adj.transpose()
    t_adj = TiledAdjacency.from_csr(t_rowptr, t_col, adj.values[t_perm.long()], shape=(adj.shape[1], adj.shape[0]))
    x = torch.randn(adj.shape[0], 4)
    assert rel_error(fgplugin.spmm(t_adj, x), case.dense().t() @ x.double()) <= 1e-6


def test_from_csr_and_scipy_agree_with_edge_index():
    case = CASES["not_divisible_weighted"]
    adj = case.adjacency()
    from_csr = TiledAdjacency.from_csr(adj.rowptr, adj.col, adj.values, shape=adj.shape)
    ei = case.edge_index.numpy()
    matrix = sp.coo_matrix((case.edge_weight.numpy(), (ei[1], ei[0])), shape=case.shape)
    from_scipy = TiledAdjacency.from_scipy(matrix)
    x = torch.randn(70, 5)
    ref = dense_spmm(case.dense(), x)
    for other in (from_csr, from_scipy):
        assert rel_error(fgplugin.spmm(other, x), ref) <= 1e-6


def test_int64_indices_chosen_beyond_int32_and_forced():
    assert index_dtype_for(2**31 - 1, 10, 10) == torch.int32
    assert index_dtype_for(2**31, 10, 10) == torch.int64
    assert index_dtype_for(5, 2**31, 10) == torch.int64
    adj = CASES["hub_row"].adjacency(index_dtype=torch.int64)
    assert adj.rowptr.dtype == adj.col.dtype == adj.tiles.tile_col.dtype == torch.int64


def test_perm_fields_and_validation():
    perm = torch.tensor([2, 0, 1])
    adj = TiledAdjacency.from_edge_index(torch.tensor([[0, 1], [1, 2]]), 3, perm=perm)
    assert adj.perm.tolist() == [2, 0, 1] and adj.inv_perm.tolist() == [1, 2, 0]
    with pytest.raises(ValueError, match="permutation"):
        TiledAdjacency.from_edge_index(torch.tensor([[0, 1], [1, 2]]), 3, perm=torch.tensor([0, 0, 1]))


def test_to_device_moves_everything_and_keeps_caches():
    adj = CASES["bipartite_wide_signed_weights"].adjacency(perm=None)
    adj.transpose()
    assert adj.to("cpu") is adj
    moved = adj.to("meta", non_blocking=True)
    assert moved.device.type == "meta" and all(t.device.type == "meta" for t in moved._tensors() if t is not None)
    assert "transpose" in moved._shared and moved.nbytes == adj.nbytes


def test_nbytes_and_repr():
    adj = CASES["hub_row"].adjacency()
    expected = (adj.rowptr.numel() + adj.col.numel() + adj.edge_perm.numel()) * 4
    assert adj.nbytes == expected  # tile statistics are computed on first use
    expected += sum(t.numel() * t.element_size() for t in (adj.tiles.panel_ptr, adj.tiles.tile_col, adj.tiles.tile_nnz))
    assert adj.nbytes == expected
    adj.transpose()
    assert adj.nbytes > expected
    text = repr(adj)
    for piece in ("shape=(300, 300)", f"nnz={adj.nnz}", "int32", "dense", "% of nnz"):
        assert piece in text


def test_pickle_and_weights_only_load_roundtrip():
    adj = CASES["not_divisible_weighted"].adjacency(perm=torch.randperm(70))
    adj.transpose()
    buffer = io.BytesIO()
    torch.save({"adj_t": adj}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["adj_t"]
    copy = pickle.loads(pickle.dumps(adj))
    x = torch.randn(70, 3)
    for other in (loaded, copy):
        assert torch.equal(fgplugin.spmm(other, x, *other.norm("gcn")), fgplugin.spmm(adj, x, *adj.norm("gcn")))
        assert torch.equal(other.perm, adj.perm) and torch.equal(other.inv_perm, adj.inv_perm)
        assert other.threshold == adj.threshold and other.tile_size == adj.tile_size


@pytest.mark.parametrize("field, damage", [
    ("col", lambda t: t.__setitem__(5, 50_000_000)),
    ("col", lambda t: t.__setitem__(5, -1)),
    ("rowptr", lambda t: t.__setitem__(3, t[4] + 1)),
    ("rowptr", lambda t: t.__setitem__(-1, t[-1] - 1)),
    ("perm", lambda t: t.__setitem__(0, t[1])),
    ("edge_perm", lambda t: t.__setitem__(0, 10**9)),
    ("values", lambda t: t.__setitem__(0, float("nan"))),
])
def test_damaged_saved_adjacency_is_refused_on_load(field, damage):
    """A saved adjacency is checked when it is read back: a damaged or edited file gives a
    ValueError that says so, never a crash or a result read from outside x."""
    adj = CASES["not_divisible_weighted"].adjacency(perm=torch.randperm(70))
    state = adj.__getstate__()
    state[field] = state[field].clone()
    damage(state[field])
    damaged = TiledAdjacency.__new__(TiledAdjacency)
    with pytest.raises(ValueError, match="damaged or was edited"):
        damaged.__setstate__(state)


def test_adjacency_saved_by_an_older_version_loads():
    """The state written before it carried a format (with a tile plan tuple) still loads."""
    adj = CASES["hub_row"].adjacency()
    state = {k: v for k, v in adj.__getstate__().items() if k not in ("format", "tile_size", "threshold")}
    state["tiles"] = (32, 0.05, torch.zeros(11, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                      torch.zeros(0, dtype=torch.int32), 0)
    state["transpose"] = None
    old = TiledAdjacency.__new__(TiledAdjacency)
    old.__setstate__(state)
    x = torch.randn(300, 4)
    assert torch.equal(fgplugin.spmm(old, x), fgplugin.spmm(adj, x)) and old.threshold == 0.05


def test_norm_is_cached_unless_values_need_grad():
    adj = CASES["self_loops"].adjacency()
    assert adj.norm("gcn") is adj.norm("gcn")
    weighted = adj.with_values(torch.rand(adj.nnz, requires_grad=True))
    assert weighted.norm("gcn") is not weighted.norm("gcn")
    assert weighted._shared is adj._shared


def test_with_values_gives_the_same_copy_for_the_same_unchanged_weights(monkeypatch):
    """So that a layer called with the same edge weights every step keeps what the copy caches
    (normalization, op arguments) and checks the weights once."""
    case = CASES["self_loops"]
    adj = TiledAdjacency.from_edge_index(case.edge_index, case.shape[1])
    w = torch.rand(adj.nnz) + 0.5
    first = adj.with_values(w)
    assert adj.with_values(w) is first and first.norm("gcn") is adj.with_values(w).norm("gcn")
    with torch.no_grad():
        w.mul_(2.0)  # written in place: a new copy with the new weights
    second = adj.with_values(w)
    assert second is not first and torch.equal(second.values.sort().values, (w.sort().values))
    with torch.no_grad():
        second.values.mul_(3.0)  # the copy's own values written: not handed out again
    assert adj.with_values(w) is not second
    temporary = w.clone()
    adj.with_values(temporary)
    count = len(adj._cache["with_values"])
    del temporary  # a copy made for weights that are gone is dropped with them
    assert len(adj._cache["with_values"]) == count - 1
    trained = w.clone().requires_grad_()  # weights that need a gradient: a copy per call
    assert adj.with_values(trained) is not adj.with_values(trained)
    bad = torch.full((adj.nnz,), float("nan"))
    with pytest.raises(ValueError, match="NaN or infinite"):
        adj.with_values(bad)
    monkeypatch.setattr(fgplugin.tiling, "capturing", lambda t: True)  # inside a CUDA graph capture
    assert torch.isnan(adj.with_values(bad).values).all()  # no host sync for the check there


def test_float_diagonals_kept_are_bounded():
    """A float diag is kept as a vector per value (no allocation per step), only the last few: a
    self-loop weight that changes every step must not hold one per value."""
    from fgplugin.tiling import MAX_CONSTANT_DIAGS

    case = CASES["self_loops"]
    adj = case.adjacency()
    x = torch.randn(case.shape[1], 3)
    for step in range(10):
        out = fgplugin.spmm(adj, x, diag=0.1 * (step + 1))
    assert len(adj._shared[("diag", torch.float32)]) == MAX_CONSTANT_DIAGS
    d = torch.full((min(case.shape),), 1.0)
    assert rel_error(out, dense_spmm(case.dense(), x, None, None, d)) <= 1e-5


# ---------------------------------------------------------------- every bad input, its error
EDGES = torch.tensor([[0, 1, 2], [1, 2, 0]])


@pytest.mark.parametrize("build,error,match", [
    (lambda: TiledAdjacency.from_edge_index(EDGES.float(), 3), TypeError, "integer node ids"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, size=3), ValueError, "for a square graph pass num_nodes"),
    (lambda: reorder_graph(EDGES, 3, seed=1.5), TypeError, "seed must be an int"),
    (lambda: TiledAdjacency.from_edge_index(EDGES.t(), 3), ValueError, r"\[2, E\].*edge_index.t\(\)"),
    (lambda: TiledAdjacency.from_edge_index(EDGES[0], 3), ValueError, r"shape \[2, E\]"),
    (lambda: TiledAdjacency.from_edge_index(np.array([[0], [1]]), 3), TypeError, "torch.Tensor"),
    (lambda: TiledAdjacency.from_edge_index(torch.tensor([[0, -1], [1, 2]]), 3), ValueError, "negative node id"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 2), ValueError, "pass num_nodes >= 3"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, size=(3, 2)), ValueError, r"pass size\[1\] >= 3"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, size=(3, 3)), ValueError, "not both"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, torch.tensor([1.0, float("nan"), 1.0])), ValueError,
     "NaN or infinite.*edge 1"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, torch.tensor([1.0, 1.0, float("inf")])), ValueError, "NaN or infinite"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, torch.ones(4)), ValueError, "one entry per edge"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, torch.ones(3, dtype=torch.long)), TypeError, "floating point"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, tile_size=0), ValueError, "tile_size"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, 3, threshold=1.5), ValueError, "threshold"),
    (lambda: TiledAdjacency.from_csr(torch.tensor([0, 2, 1]), torch.tensor([0, 1])), ValueError, "end at nnz"),
    (lambda: TiledAdjacency.from_csr(torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1, 2])), ValueError, "non-decreasing"),
    (lambda: TiledAdjacency.from_csr(torch.tensor([0, 1]), torch.tensor([5])), ValueError, "outside"),
    (lambda: TiledAdjacency.from_csr(torch.tensor([0.0, 1.0]), torch.tensor([0])), TypeError, "int32 or int64"),
    (lambda: TiledAdjacency.from_edge_index(EDGES, size=(3, 4), perm=torch.arange(4)), ValueError, "rectangular"),
])
def test_bad_graph_input_raises_clear_error(build, error, match):
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize("call,error,match", [
    (lambda adj: fgplugin.spmm(adj, torch.randn(4, 2)), ValueError, "x has 4 rows but the adjacency has 3"),
    (lambda adj: fgplugin.spmm(adj, torch.randn(3)), ValueError, "2-D floating-point"),
    (lambda adj: fgplugin.spmm(adj, torch.ones(3, 2, dtype=torch.long)), ValueError, "2-D floating-point"),
    (lambda adj: fgplugin.spmm(adj, torch.randn(3, 2, device="meta")), ValueError, "adj.to"),
    (lambda adj: fgplugin.spmm(adj, torch.randn(3, 2), torch.ones(5)), ValueError, "row_scale must be .* length 3"),
    (lambda adj: fgplugin.spmm(EDGES, torch.randn(3, 2)), TypeError, "TiledAdjacency"),
    (lambda adj: adj.norm("sym"), ValueError, "unknown normalization"),
    (lambda adj: adj.norm("gcn", dtype=torch.int64), ValueError, "floating-point torch dtype"),
    (lambda adj: adj.norm("mean", dtype=torch.bool), ValueError, "floating-point torch dtype"),
    (lambda adj: adj.norm("mean", improved=True), ValueError, "options of the 'gcn' normalization"),
    (lambda adj: adj.norm("both", add_self_loops=True), ValueError, "options of the 'gcn' normalization"),
    (lambda adj: TiledAdjacency.from_edge_index(EDGES, size=(3, 2 + 2)).norm("gcn"), ValueError, "square"),
])
def test_bad_spmm_input_raises_clear_error(call, error, match):
    adj = TiledAdjacency.from_edge_index(EDGES, 3)
    with pytest.raises(error, match=match):
        call(adj)


def test_the_kinds_without_loops_take_add_self_loops_false():
    adj = TiledAdjacency.from_edge_index(EDGES, 3)
    assert all(torch.equal(a, b) for a, b in zip(adj.norm("both", add_self_loops=False)[:2], adj.norm("both")[:2]))


def test_to_moves_or_copies_and_refuses_a_dtype():
    adj = TiledAdjacency.from_edge_index(EDGES, 3, torch.tensor([0.5, 2.0, 1.0]))
    assert adj.to("cpu") is adj and adj.to() is adj
    copied = adj.to("cpu", copy=True)
    assert copied is not adj and copied.values.data_ptr() != adj.values.data_ptr()
    assert torch.equal(fgplugin.spmm(copied, torch.eye(3)), fgplugin.spmm(adj, torch.eye(3)))
    for call in (lambda: adj.to(torch.float64), lambda: adj.to(dtype=torch.float64), lambda: adj.to("cpu", torch.half)):
        with pytest.raises(TypeError, match="has no dtype to change"):
            call()


def test_raw_op_rejects_mismatched_arguments():
    adj = TiledAdjacency.from_edge_index(EDGES, 3)
    with pytest.raises(RuntimeError, match="values must have dtype"):
        torch.ops.fgplugin.spmm(adj.rowptr, adj.col, torch.ones(3, dtype=torch.float64), torch.randn(3, 2),
                                None, None, None, None, [], None, None, None, None, [])
    with pytest.raises(RuntimeError, match="col must be 1-D with the dtype of rowptr"):
        torch.ops.fgplugin.spmm(adj.rowptr, adj.col.long(), None, torch.randn(3, 2), None, None, None, None, [],
                                None, None, None, None, [])


def test_threshold_probe_walks_towards_denser_plans_until_one_is_slower():
    """The probe times the no-dense plan first, then ever denser ones, and stops at the first plan
    more than STOP_MARGIN slower than the best so far: the plans after it are neither built nor
    timed. Where a denser plan wins, the no-dense plan is timed once more."""
    from fgplugin.autotune import STOP_MARGIN, search_groups

    groups = [[0.02], [0.03, 0.05], [0.075], [0.10], [0.15, 1.0]]  # plan_groups' order: densest first
    timed = []

    def time_group(ms_of):
        def run(group):
            timed.append(max(group))
            return ms_of[max(group)]
        return run

    # a large community graph: denser plans get faster down to 0.05, then slower
    falling = {1.0: 6.5, 0.10: 5.2, 0.075: 4.9, 0.05: 5.0, 0.02: 5.6}
    times = search_groups(groups, time_group(falling))
    # 0.05 is within the margin of 0.075: the walk goes on; a denser plan won: 1.0 is timed again
    assert timed == [1.0, 0.10, 0.075, 0.05, 0.02, 1.0]
    assert min(times, key=times.get) == 0.075 and times[0.03] == times[0.05] == 5.0
    # a small graph: the first dense plan is slower (a launch more), nothing denser is built
    timed.clear()
    rising = {1.0: 0.040, 0.10: 0.040 * (1 + 2 * STOP_MARGIN), 0.075: 0.01, 0.05: 0.01, 0.02: 0.01}
    times = search_groups(groups, time_group(rising))
    assert timed == [1.0, 0.10] and set(times) == {0.15, 1.0, 0.10}
    assert min(times, key=lambda thr: (times[thr], -thr)) == 1.0  # choose_threshold's rule
    # a first timing that ran slow: the dense plan seems to win until 1.0 is timed again
    first_runs = iter([0.080, 0.040])

    def slow_first(group):
        return next(first_runs) if max(group) == 1.0 else {0.10: 0.060, 0.075: 0.07}.get(max(group), 0.09)

    times = search_groups(groups, slow_first)
    assert times[1.0] == 0.040 and min(times, key=lambda thr: (times[thr], -thr)) == 1.0


def test_dense_tiles_must_win_by_a_margin():
    from fgplugin.autotune import MIN_DENSE_GAIN, fastest

    assert fastest({0.05: 5.0, 0.10: 5.2, 0.15: 6.5, 1.0: 6.5}) == 0.05  # reddit-like: 23% faster
    close = 1.0 * (1 - MIN_DENSE_GAIN / 2)
    assert fastest({0.10: close, 0.15: 1.0, 1.0: 1.0}) == 1.0  # within the margin: no dense tiles
    assert fastest({0.02: 0.5, 0.05: 0.5}) == 0.05  # without a no-dense time: the fastest, largest


def test_threshold_probe_groups_candidates_by_plan():
    """The probe times one plan per group of candidate thresholds: those that make the same tiles
    dense, and with the no-dense-tile plan (1.0) every threshold whose dense tiles would hold under
    5% of the non-zeros."""
    from fgplugin.autotune import MIN_DENSE_SHARE, plan_groups

    # tile non-zero counts of 32x32 tiles: one of 600 (59% density), one of 60 (5.9%), many of 3
    counts = torch.tensor([600, 60] + [3] * 2000)
    nnz = int(counts.sum())  # 6660: the 600-tile holds 9%, the 60-tile 0.9%
    groups = plan_groups(counts, nnz, (0.02, 0.05, 0.10, 1.0))
    assert sorted(map(sorted, groups)) == [[0.02, 0.05], [0.1], [1.0]]  # 0.10 keeps only the 600-tile: 9%
    # the same tiles in a 20x larger graph hold 0.5%: every candidate is timed as the no-dense plan
    many = torch.cat([counts, torch.full((40000,), 3)])
    assert 600 / int(many.sum()) < MIN_DENSE_SHARE
    assert sorted(map(sorted, plan_groups(many, int(many.sum()), (0.02, 0.05, 0.10, 1.0)))) == [[0.02, 0.05, 0.1, 1.0]]


def test_graphs_under_the_probe_floor_get_no_dense_tiles_unprobed(monkeypatch):
    """On CUDA a graph under PROBE_MIN_NNZ non-zeros gets 1.0 (no dense tiles) without a plan
    built or timed; one at the floor is probed and gets the probe's choice."""
    from types import SimpleNamespace

    from fgplugin import autotune

    probed = []

    def probe(adj, **kwargs):
        probed.append(adj.nnz)
        return {0.05: 0.5, 1.0: 1.0}  # dense tiles twice as fast

    monkeypatch.setattr(autotune, "probe_thresholds", probe)
    cuda = torch.device("cuda")  # only its type is read: no GPU needed
    small = SimpleNamespace(device=cuda, nnz=autotune.PROBE_MIN_NNZ - 1)
    assert autotune.choose_threshold(small) == {"threshold": 1.0, "times_ms": {}, "plan": None} and not probed
    large = SimpleNamespace(device=cuda, nnz=autotune.PROBE_MIN_NNZ)
    assert autotune.choose_threshold(large)["threshold"] == 0.05 and probed == [autotune.PROBE_MIN_NNZ]


def test_another_view_of_checked_memory_is_checked_again():
    """The kernels' memory of checked tensors tells views of one storage apart by their strides:
    a view holding an out-of-range id after a valid view of the same memory is refused, not read."""
    base = torch.zeros(8, dtype=torch.int64)
    base[4::2] = 10**9
    rowptr, x = torch.tensor([0, 1, 2, 3, 4]), torch.randn(4, 8)
    fgplugin.spmm(TiledAdjacency(rowptr, base[:4], None, (4, 4)), x)  # valid: ids 0
    with pytest.raises((RuntimeError, ValueError), match="source node 1000000000"):
        fgplugin.spmm(TiledAdjacency(rowptr, base[::2], None, (4, 4)), x)


def test_with_values_needs_the_edge_order():
    """Per-edge values in edge-list order map onto an adjacency that kept that order, and are
    refused by one built without it (they would land on other edges)."""
    ei = torch.tensor([[1, 0, 2], [2, 1, 0]])  # the CSR order (by target) reverses the edge list
    w, x = torch.tensor([10.0, 20.0, 30.0]), torch.eye(3)
    expected = torch.zeros(3, 3)
    expected[ei[1], ei[0]] = w
    assert torch.equal(fgplugin.spmm(TiledAdjacency.from_edge_index(ei, 3).with_values(w), x), expected)
    dropped = TiledAdjacency.from_edge_index(ei, 3, keep_edge_order=False)
    with pytest.raises(ValueError, match="keep_edge_order=True"):
        dropped.with_values(w)
    again = torch.load(_saved(dropped), weights_only=True)
    with pytest.raises(ValueError, match="keep_edge_order=True"):
        again.to("cpu").with_values(w)
    assert dropped.with_values(None).values is None  # unit weights need no order


def _saved(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_built_or_inspected_in_inference_mode_then_trained():
    """What an adjacency builds and keeps (its arrays, transpose, degrees) under
    torch.inference_mode() must not be inference tensors: training reads them afterwards."""
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    with torch.inference_mode():
        adj = TiledAdjacency.from_edge_index(ei, 3)
        assert not adj.is_symmetric
        adj.transpose()
        adj.in_degree()
        adj.self_loop_mask()
    x = torch.randn(3, 4, requires_grad=True)
    fgplugin.spmm(adj, x, *adj.norm("gcn")).sum().backward()
    assert x.grad is not None and not adj.rowptr.is_inference()


def test_index_dtype_and_perm_are_checked():
    ei = torch.tensor([[0, 1], [1, 0]])
    for bad in (torch.int16, torch.float32):
        with pytest.raises(ValueError, match="index_dtype must be torch.int32 or torch.int64"):
            TiledAdjacency.from_edge_index(ei, 2, index_dtype=bad)
    with pytest.raises(ValueError, match="cannot hold this graph's indices"):
        TiledAdjacency.from_edge_index(torch.tensor([[2**32 + 3], [0]]), size=(2**32 + 10, 2), index_dtype=torch.int32)
    adj = TiledAdjacency.from_edge_index(ei, 2)
    with pytest.raises(ValueError, match="permutation"):
        adj.perm = torch.tensor([0, 0])
    adj.perm = torch.tensor([1, 0])
    assert adj.inv_perm.tolist() == [1, 0]


def test_constructor_scipy_state_and_op_arguments_are_checked():
    """What the review found unchecked: the class constructor's lengths, a scipy matrix's type
    and complex data (float64 data keeps its precision), a saved shape or rectangular perm, a
    missing adjacency, sparse features, a gradient of the wrong shape."""
    with pytest.raises(ValueError, match="rowptr must have shape"):
        TiledAdjacency(torch.tensor([0, 1, 2, 3, 4, 5]), torch.tensor([0, 1, 2, 0, 1]), None, (3, 3))
    with pytest.raises(TypeError, match="scipy.sparse"):
        TiledAdjacency.from_scipy(torch.eye(3))
    with pytest.raises(TypeError, match="real edge weights"):
        TiledAdjacency.from_scipy(sp.csr_matrix(np.eye(3) * (1 + 2j)))
    weights = sp.csr_matrix(np.array([[0.0, 1 / 3], [2 / 3, 0.0]]))
    assert TiledAdjacency.from_scipy(weights).values.dtype == torch.float64
    with pytest.raises(ValueError, match="shape must be"):
        TiledAdjacency.from_csr(torch.tensor([0, 1]), torch.tensor([0]), shape=(1,))
    adj = TiledAdjacency.from_edge_index(torch.tensor([[0, 1], [1, 0]]), size=(2, 3))
    state = adj.__getstate__()
    state["perm"] = torch.tensor([1, 0, 2])
    with pytest.raises(ValueError, match="damaged or was edited"):
        TiledAdjacency.__new__(TiledAdjacency).__setstate__(state)
    square = TiledAdjacency.from_edge_index(torch.tensor([[0, 1], [1, 0]]), 2)
    with pytest.raises(TypeError, match="expects a TiledAdjacency"):
        fgplugin.spmm(None, torch.randn(2, 3))
    with pytest.raises(ValueError, match="dense tensor"):
        fgplugin.spmm(square, torch.randn(2, 3).to_sparse())
    with pytest.raises(ValueError, match="grad must be the output's gradient"):
        fgplugin.ops.spmm_vjp(square, torch.randn(2, 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match="grad must be floating point"):
        fgplugin.ops.spmm_vjp(square, torch.randn(2, 3), torch.ones(2, 3, dtype=torch.long))


def test_numpy_integers_are_taken_where_ints_are():
    import numpy as np
    adj = TiledAdjacency.from_csr(torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 0]), shape=(np.int64(3), np.int64(3)))
    assert adj.shape == (3, 3)
    x = torch.randn(3, 4)
    torch.testing.assert_close(fgplugin.spmm(adj, x, width=np.int64(2)), fgplugin.spmm(adj, x)[:, :2])


def test_spmm_vjp_takes_a_gradient_in_another_float_dtype_at_x_s_precision():
    weighted = TiledAdjacency.from_edge_index(EDGES, 3, torch.tensor([0.5, 2.0, 1.5]))
    x, grad = torch.randn(3, 2), torch.randn(3, 2, dtype=torch.float64)
    got = fgplugin.ops.spmm_vjp(weighted, x, grad)
    expected = fgplugin.ops.spmm_vjp(weighted, x, grad.float())
    for g, e in zip(got, expected):
        assert (g is None) == (e is None) and (g is None or torch.equal(g, e))
