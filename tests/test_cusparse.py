"""fgplugin.cusparse: products routed to torch.sparse.mm (cuSPARSE) where a probe finds it faster.

Forced on (``set_cusparse("1")``) the route runs on any device, so its products and gradients are
checked against the float64 reference on the CPU too; on CUDA the probe's choice (per width, once,
on its second product) is obeyed and kept, and a captured step with a routed product replays the
eager steps. Where the route's conditions are made to hold off CUDA, the CPU checks when the choice
is made: by the second product at a width on an adjacency, never by a product whose result is kept
(the input cache's dense aggregation, SGConv's cached propagation), with the kept calls of
fgplugin.repeated_calls and fgplugin.layer_calls waiting for it."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import fgplugin
from fgplugin import autotune, cusparse, grad_rows
from fgplugin.testing import clustered_case, dense_spmm, graph_cases, random_graph_case, rel_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="the probe times CUDA kernels")
WIDTH = 72  # >= MIN_WIDTH, not a multiple of the kernels' vector width


@pytest.fixture(autouse=True)
def auto_mode():
    previous = fgplugin.set_cusparse("auto")
    yield
    fgplugin.set_cusparse(previous)


@pytest.fixture
def routed(monkeypatch):
    """Counts the products that take the route."""
    calls = []
    product = cusparse.product

    def counting(*args):
        calls.append(args[1].shape[1])
        return product(*args)

    monkeypatch.setattr(cusparse, "product", counting)
    return calls


def _scales(case, device, kind):
    n_dst, n_src = case.shape
    g = torch.Generator().manual_seed(7)
    if kind == "none":
        return None, None, None
    if kind == "float_diag":
        return None, None, 1.0
    rs, cs = torch.rand(n_dst, generator=g) + 0.5, torch.rand(n_src, generator=g) + 0.5
    diag = torch.rand(min(n_dst, n_src), generator=g)
    return rs.to(device), cs.to(device), diag.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["scales", "none", "float_diag"])
def test_forced_products_and_gradients_match_float64(device, kind, fresh_seed, routed):
    fgplugin.set_cusparse("1")
    cases = [c for c in graph_cases()] + [random_graph_case(fresh_seed, n_src=150, n_dst=90, weighted=True),
                                         clustered_case(fresh_seed, weighted=True)]
    for case in cases:
        adj = case.adjacency().to(device)
        rs, cs, diag = _scales(case, device, kind)
        x = torch.randn(case.shape[1], WIDTH, device=device, requires_grad=True)
        out = fgplugin.spmm(adj, x, rs, cs, diag)
        d = diag if not isinstance(diag, float) else torch.full((min(case.shape),), diag)
        assert rel_error(out, dense_spmm(case.dense(), x, rs, cs, d)) <= 1e-5, case.name
        g = torch.randn_like(out)
        out.backward(g)
        dense_t = case.dense().t()
        assert rel_error(x.grad, dense_spmm(dense_t, g, cs, rs, d)) <= 1e-5, case.name
    assert len(routed) == len(cases)


@pytest.mark.parametrize("device", DEVICES)
def test_what_the_route_cannot_do_stays_on_fgplugin(device, routed):
    """Gradients for the edge values or the scales, float64 features and 16-bit autocast run on
    fgplugin's kernels even when forced; the mode 0 never routes, and auto never routes off CUDA."""
    case = clustered_case(5, weighted=True)
    adj = case.adjacency().to(device)
    n = case.shape[1]
    fgplugin.set_cusparse("1")
    weights = case.edge_weight.to(device).requires_grad_()
    weighted = adj.with_values(weights)
    scale = torch.rand(case.shape[0], device=device, requires_grad=True)
    x = torch.randn(n, WIDTH, device=device)
    out = fgplugin.spmm(adj, x, scale)
    out.sum().backward()
    assert scale.grad is not None and routed == []
    fgplugin.spmm(adj, x.double())
    with torch.autocast(device, dtype=torch.bfloat16):
        fgplugin.spmm(adj, x)
    assert routed == []
    fgplugin.spmm(weighted, x).sum().backward()
    assert weights.grad is not None and routed == []
    fgplugin.set_cusparse("0")
    fgplugin.spmm(adj, x)
    assert routed == []
    if device == "cpu":
        fgplugin.set_cusparse("auto")
        fgplugin.spmm(adj.with_tiles(threshold="auto"), x)
        assert routed == []


def test_the_fold_follows_in_place_writes_and_new_scales(routed):
    fgplugin.set_cusparse("1")
    case = random_graph_case(11, n_src=120, weighted=True)
    adj = case.adjacency()
    x = torch.randn(120, WIDTH)
    rs = torch.rand(120) + 0.5
    first = fgplugin.spmm(adj, x, rs)
    assert rel_error(fgplugin.spmm(adj, x, rs), first) == 0  # the kept fold
    with torch.no_grad():
        adj.values.mul_(2.0)
    assert rel_error(fgplugin.spmm(adj, x, rs), 2 * first) <= 1e-6
    with torch.no_grad():
        rs.mul_(3.0)
    assert rel_error(fgplugin.spmm(adj, x, rs), 6 * first) <= 1e-6
    other = rs.clone() / 3
    assert rel_error(fgplugin.spmm(adj, x, other), 2 * first) <= 1e-6
    assert len(routed) == 5


@pytest.mark.parametrize("mode", ["auto", "1"])
def test_torch_compile_traces_fgplugins_op_at_every_width(mode):
    """Under torch.compile the route stays out of the way (it reads a context variable and host
    state that Dynamo cannot trace): fullgraph compiles at 128 columns, as at 32."""
    fgplugin.set_cusparse(mode)
    case = clustered_case(12)
    adj = case.adjacency(threshold="auto")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    for width in (32, 128):
        x = torch.randn(case.shape[1], width)
        compiled = torch.compile(lambda x: fgplugin.spmm(adj, x, r, c, d), fullgraph=True, backend="eager")
        assert rel_error(compiled(x), dense_spmm(case.dense(), x, r, c, d)) <= 1e-5


def test_a_fold_is_kept_per_set_of_scales_as_passed(monkeypatch):
    """float64 scales (cast to float32 on every call) and two normalizations of one graph used in
    turn (GCN and SAGE layers on one edge_index) find their folds again instead of rebuilding one
    per call."""
    fgplugin.set_cusparse("1")
    folds = []
    fold = cusparse._fold
    monkeypatch.setattr(cusparse, "_fold", lambda *args: folds.append(1) or fold(*args))
    case = random_graph_case(13, n_src=150)
    adj = case.adjacency()
    x = torch.randn(150, WIDTH)
    for _ in range(3):
        out = fgplugin.spmm(adj, x, *adj.norm("gcn"))  # float64 scales
    assert len(folds) == 1 and rel_error(out, dense_spmm(case.dense(), x, *adj.norm("gcn"))) <= 1e-5
    gcn, mean = adj.norm("gcn", dtype=torch.float32), adj.norm("mean", dtype=torch.float32)
    for _ in range(3):
        fgplugin.spmm(adj, x, *gcn)
        fgplugin.spmm(adj, x, *mean)
    assert len(folds) == 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("live_fraction", [0.1, 1.0])
def test_a_routed_products_backward_skips_zero_rows_as_fgplugins_does(device, live_fraction, monkeypatch, routed):
    """Over the zero-row skipping's size floor a product may run on cuSPARSE too: a row-sparse
    gradient (a masked loss's) then runs the restricted backward product on fgplugin's kernel, a
    dense one the transposed product on cuSPARSE; both as the float64 reference."""
    fgplugin.set_cusparse("1")
    monkeypatch.setattr(grad_rows, "MIN_WORK", {"cuda": 0, "cpu": 0})
    skipping = fgplugin.set_row_skipping(True)
    try:
        case = random_graph_case(17, n_src=300, avg_degree=10.0)
        adj = case.adjacency().to(device)
        r, c, d = adj.norm("gcn", dtype=torch.float32)
        x = torch.randn(300, WIDTH, device=device, requires_grad=True)
        g = torch.randn(300, WIDTH, device=device)
        g[torch.rand(300, device=device) >= live_fraction] = 0
        out = fgplugin.spmm(adj, x, r, c, d)
        out.backward(g)
        assert routed == [WIDTH]
        assert rel_error(x.grad, dense_spmm(case.dense().t(), g, c, r, d)) <= 1e-5
        builds = grad_rows.stats(adj.transpose()[1])["builds"]
        assert builds == (1 if live_fraction < grad_rows.MAX_LIVE_FRACTION else 0)
    finally:
        fgplugin.set_row_skipping(skipping)


def test_set_cusparse_checks_its_argument():
    assert fgplugin.set_cusparse("0") == "auto"
    assert fgplugin.set_cusparse(True) == "0"
    assert fgplugin.set_cusparse("off") == "1"
    with pytest.raises(ValueError, match="set_cusparse takes"):
        fgplugin.set_cusparse("maybe")


@CUDA
@pytest.mark.parametrize("faster", [True, False])
def test_the_probes_choice_is_obeyed_and_kept_per_width(faster, monkeypatch, routed):
    probes = []

    def probe(adj, width, *scales):
        probes.append(width)
        return faster

    monkeypatch.setattr(cusparse, "_cusparse_is_faster", probe)
    case = clustered_case(8)
    adj = case.adjacency(threshold="auto").to("cuda")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    for width in (WIDTH, WIDTH, WIDTH, 128, 128, 16, 16, 300, 300):
        x = torch.randn(case.shape[1], width, device="cuda")
        out = fgplugin.spmm(adj, x, r, c, d)
        assert rel_error(out, dense_spmm(case.dense(), x, r, c, d)) <= 1e-5
    assert probes == [WIDTH, 128]  # once per width, on its second product; 16 and 300 columns never
    assert routed == ([WIDTH, WIDTH, 128] if faster else [])
    fixed = adj.with_tiles(threshold=0.05)  # a fixed threshold asks for fgplugin's kernel
    fgplugin.spmm(fixed, torch.randn(case.shape[1], 128, device="cuda"), r, c, d)
    assert len(routed) == (3 if faster else 0)


@CUDA
def test_graphs_over_the_size_cap_are_never_timed(monkeypatch, routed):
    monkeypatch.setattr(cusparse, "_cusparse_is_faster", lambda *args: pytest.fail("timed a graph over MAX_NNZ"))
    case = clustered_case(9)
    adj = case.adjacency(threshold="auto").to("cuda")
    monkeypatch.setattr(cusparse, "MAX_NNZ", adj.nnz - 1)
    x = torch.randn(case.shape[1], 128, device="cuda")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    assert rel_error(fgplugin.spmm(adj, x, r, c, d), dense_spmm(case.dense(), x, r, c, d)) <= 1e-5
    assert routed == []


@CUDA
def test_the_real_probe_decides_once():
    case = random_graph_case(2, n_src=3000, avg_degree=8)
    adj = case.adjacency(threshold="auto").to("cuda")
    x = torch.randn(3000, 128, device="cuda")
    for _ in range(2):  # the second product at a width times it
        fgplugin.spmm(adj, x, *adj.norm("gcn", dtype=torch.float32))
    assert isinstance(adj._shared[("cusparse", 128, False)], bool)  # an eager choice
    with autotune.for_captured_step():
        for _ in range(2):
            fgplugin.spmm(adj, x, *adj.norm("gcn", dtype=torch.float32))
    assert isinstance(adj._shared[("cusparse", 128, True)], bool)  # a captured step's own


def _routed_problem(monkeypatch, seed: int, features: int):
    """A 400-node CUDA problem (x, y, training index, edge_index) whose products of 64-256 columns
    the probe sends to cuSPARSE (its answer forced)."""
    monkeypatch.setattr(cusparse, "_cusparse_is_faster", lambda *args: True)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(400, features, generator=g).cuda()
    y = torch.randint(0, 4, (400,), generator=g).cuda()
    return x, y, torch.arange(0, 400, 5, device="cuda"), clustered_case(seed, n_src=400).edge_index.cuda()


@CUDA
def test_a_routed_product_is_captured_and_replays_the_eager_steps(monkeypatch, routed):
    """graphed_step's warm-up makes the choice (the probe's answer forced here), the capture
    records the cuSPARSE product, and the replayed steps give the eager steps' losses (the eager
    reference on fgplugin's kernels, with the fused Adam the captured step switches to)."""
    import fgplugin.pyg as fg

    x, y, idx, ei = _routed_problem(monkeypatch, 9, 96)

    class Net(torch.nn.Module):  # the middle layer aggregates 72 columns every step
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([fg.GCNConv(96, 80, cached=True), fg.GCNConv(80, 72, cached=True),
                                              fg.GCNConv(72, 4, cached=True)])

        def forward(self, x, edge_index):
            for conv in self.convs[:-1]:
                x = conv(x, edge_index).relu()
            return self.convs[-1](x, edge_index)

    torch.manual_seed(0)
    model = Net().cuda()
    reference = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, ei)
    losses = [float(step()) for _ in range(5)]
    assert isinstance(step.graph, torch.cuda.CUDAGraph)
    assert routed.count(72) == 2 + 1  # the warm-up steps from the second (which times it) and the capture
    fgplugin.set_cusparse("0")
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01, fused=True)
    expected = []
    for _ in range(3 + 5):
        ref_opt.zero_grad()
        loss = F.cross_entropy(reference(x, ei)[idx], y[idx])
        loss.backward()
        ref_opt.step()
        expected.append(float(loss))
    assert losses == pytest.approx(expected[3:], rel=1e-4)


@CUDA
def test_two_normalizations_of_one_graph_are_captured(monkeypatch, routed):
    """A GCN layer and a SAGE layer on one edge_index route two folds of one adjacency; both are
    kept through the warm-up, so the capture finds them (a fold built during a capture would need
    host syncs)."""
    import fgplugin.pyg as fg
    from fgplugin.graphed import GraphedStepWarning

    x, y, idx, ei = _routed_problem(monkeypatch, 14, 72)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gcn, self.sage, self.out = fg.GCNConv(72, 72), fg.SAGEConv(72, 72), fg.GCNConv(72, 4)

        def forward(self, x, edge_index):
            h = self.gcn(x.relu(), edge_index).relu()
            return self.out(self.sage(h, edge_index).relu(), edge_index)

    model = Net().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphedStepWarning)
        step = fgplugin.graphed_step(model, opt, lambda out: F.cross_entropy(out[idx], y[idx]), x, ei)
    assert isinstance(step.graph, torch.cuda.CUDAGraph) and routed.count(72) >= 2 * (2 + 1)
    losses = [float(step()) for _ in range(20)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("device", DEVICES)
def test_forced_route_applies_the_epilogue(device, routed):
    """A product routed to cuSPARSE cuts and adds the bias after it: values and the gradients of
    ``x`` and the bias as on fgplugin's kernels (float64 reference)."""
    fgplugin.set_cusparse("1")
    case = random_graph_case(21, n_src=120, avg_degree=6.0)
    adj = case.adjacency().to(device)
    r, c, d = _scales(case, device, "scales")
    g = torch.Generator().manual_seed(22)
    x = torch.randn(120, WIDTH, generator=g).to(device).requires_grad_()
    b = torch.randn(WIDTH - 3, generator=g).to(device).requires_grad_()
    out = fgplugin.spmm(adj, x, r, c, d, bias=b, width=WIDTH - 3)
    assert routed == [WIDTH]
    on_cpu = lambda t: t.double().cpu()  # noqa: E731
    ref = dense_spmm(case.dense(), on_cpu(x.detach()), on_cpu(r), on_cpu(c), on_cpu(d))[:, :WIDTH - 3]
    assert out.shape == (120, WIDTH - 3) and rel_error(out, ref + on_cpu(b.detach())) <= 1e-5
    upstream = torch.randn(out.shape, generator=g).to(device)
    grad_x, grad_b = torch.autograd.grad(out, (x, b), upstream)
    padded = F.pad(upstream.double().cpu(), (0, 3))
    assert rel_error(grad_x, dense_spmm(case.dense().t(), padded, on_cpu(c), on_cpu(r), on_cpu(d))) <= 1e-5
    assert rel_error(grad_b, upstream.double().cpu().sum(0)) <= 1e-5


@pytest.fixture
def route_anywhere(monkeypatch):
    """The route's conditions but the device's made to hold, so that when the choice is made can
    be checked on the CPU; the probe's answer set by ``route_anywhere.faster``, its widths listed
    in ``route_anywhere.probed``."""
    applies = cusparse._applies

    def on_any_device(adj, x, row_scale, col_scale, diag, forced):
        if not forced and (adj.threshold != "auto" or adj.nnz > cusparse.MAX_NNZ):
            return False
        return applies(adj, x, row_scale, col_scale, diag, True)

    monkeypatch.setattr(cusparse, "_applies", on_any_device)

    class Probe:
        faster, probed = True, []

        def __call__(self, adj, width, *rest):
            self.probed.append(width)
            return self.faster

    probe = Probe()
    probe.probed = []
    monkeypatch.setattr(cusparse, "_cusparse_is_faster", probe)
    return probe


@pytest.mark.parametrize("faster", [True, False])
def test_a_width_is_timed_on_its_second_product_and_kept_from_then_on(faster, route_anywhere, routed):
    """The first product at a width runs fgplugin's kernel untimed and is not kept for repeated
    calls (which would never ask again); the second times it; the choice holds from then on."""
    route_anywhere.faster = faster
    case = clustered_case(3)
    adj = case.adjacency(threshold="auto")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    x = torch.randn(case.shape[1], WIDTH, requires_grad=True)
    kept_after = []
    for _ in range(4):
        out = fgplugin.spmm(adj, x, r, c, d)
        assert rel_error(out, dense_spmm(case.dense(), x.detach(), r, c, d)) <= 1e-5
        g = torch.randn_like(out)
        (grad,) = torch.autograd.grad(out, x, g)
        assert rel_error(grad, dense_spmm(case.dense().t(), g, c, r, d)) <= 1e-5
        kept_after.append(len(getattr(adj, "_calls", ())))
    assert route_anywhere.probed == [WIDTH]
    assert routed == ([WIDTH] * 3 if faster else [])
    assert kept_after == ([0] * 4 if faster else [0, 1, 1, 1])  # a routed product is never a kept call


def _model(kind: str, features: int, hidden: int, layers: int, input_dropout: bool):
    """A GCN (``layers`` GCNConv layers) or an SGConv with K = 2 (``sgc``, or ``sgc-cached``)."""
    import fgplugin.pyg as fg

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if kind.startswith("sgc"):
                # more outputs than inputs: both hops aggregate x itself
                self.convs = torch.nn.ModuleList([fg.SGConv(features, 96, K=2, cached=kind == "sgc-cached")])
                return
            widths = [features] + [hidden] * (layers - 1) + [4]
            self.convs = torch.nn.ModuleList(fg.GCNConv(a, b, cached=True) for a, b in zip(widths, widths[1:]))

        def forward(self, x, edge_index):
            if input_dropout:
                x = F.dropout(x, 0.5, self.training)
            for conv in self.convs[:-1]:
                x = conv(x, edge_index).relu()
            return self.convs[-1](x, edge_index)

    return Net()


def _losses(model, x, y, idx, ei, steps: int, seed: int = 0) -> list[float]:
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, ei)[idx], y[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind, features, layers, input_dropout, probed, routed_products", [
    # the first layer's A (x W) runs once, then the input cache builds and keeps A x (96 columns)
    ("gcn", 96, 2, False, [], 0),
    # aggregating first, A x at WIDTH on the first call and again in the cache's build
    ("gcn", WIDTH, 2, False, [], 0),
    # a dropped input changes every step: its product repeats, timed on step 2, routed from then on
    ("gcn", 96, 2, True, [WIDTH], 4),
    # the hidden layer's product is the second at WIDTH on step 1 already
    ("gcn", 96, 3, False, [WIDTH], 5),
    # SGConv's two hops at one width: cached=True propagates once; uncached, step 1's second hop
    # times the route (x may change from call to call) and the cache's build (two hops) obeys it
    ("sgc-cached", WIDTH, 1, False, [], 0),
    ("sgc", WIDTH, 1, False, [WIDTH], 3),
])
def test_a_model_times_only_the_products_it_repeats(kind, features, layers, input_dropout, probed, routed_products,
                                                    route_anywhere, routed):
    """A GCN on a constant input never times the route for its first layer, whose products run
    once before the input cache keeps A x; nor does a product whose result is kept; the second
    product at a width (per adjacency) times it and the width is routed from then on, through the
    layers' kept calls too; the losses are those of fgplugin's kernels throughout."""
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(300, features, generator=g), torch.randint(0, 4, (300,), generator=g)
    idx, ei = torch.arange(0, 300, 3), clustered_case(4, n_src=300).edge_index
    model = _model(kind, features, WIDTH, layers, input_dropout)
    reference = copy.deepcopy(model)
    losses = _losses(model, x, y, idx, ei, steps=5)
    assert route_anywhere.probed == probed
    assert routed == [WIDTH] * routed_products
    fgplugin.set_cusparse("0")
    assert losses == pytest.approx(_losses(reference, x, y, idx, ei, steps=5), rel=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_a_hidden_layer_keeps_its_product_call_once_the_route_is_chosen(padded, route_anywhere, monkeypatch):
    """A hidden layer's first call is not kept while its product's route is undecided; its second
    call decides the route (fgplugin's kernel here) and keeps the product's call with the layer's,
    so later calls run it in one step from C++; with the weight padded (as the CUDA kernels pad
    it) the route is the padded width's."""
    route_anywhere.faster = False
    import fgplugin.pyg as fg

    out = WIDTH - 2 if padded else WIDTH
    if padded:
        monkeypatch.setattr(fgplugin.aggregation.Aggregation, "vector_width", lambda self, features, dtype: WIDTH)
    conv = fg.GCNConv(96, out, cached=True)  # more inputs than outputs: A (x W) + b
    ei = clustered_case(6, n_src=200).edge_index
    kept = []
    for _ in range(3):
        x = torch.randn(200, 96, requires_grad=True)
        conv(x, ei).sum().backward()
        call = conv.__dict__.get("_fgplugin_layer_call")
        kept.append(None if call is None else call.decision.product is not None)
    assert route_anywhere.probed == [WIDTH]
    assert kept == [None, fgplugin.extension_status().loaded, fgplugin.extension_status().loaded]


@pytest.mark.parametrize("other", ["off", "fixed threshold", "float64"])
def test_a_layer_is_kept_where_its_product_never_asks_for_the_route(other, route_anywhere, monkeypatch):
    """A width left open by another product on the adjacency (a one-off product at that width)
    does not keep a layer from keeping its call when its own product never reaches the route: the
    route switched off, a copy of the adjacency with a fixed threshold, float64 features. (No
    product call from C++ here, as for products over the zero-row skipping's work floor.)"""
    import fgplugin.pyg as fg

    monkeypatch.setattr(fgplugin._extension, "kept_spmm", None)

    case = clustered_case(6, n_src=200)
    adj = case.adjacency(threshold="auto")
    fgplugin.spmm(adj, torch.randn(200, WIDTH), *adj.norm("gcn", dtype=torch.float32))  # leaves WIDTH open
    graph, dtype = adj, torch.float32
    if other == "off":
        fgplugin.set_cusparse("0")
    elif other == "fixed threshold":
        graph = adj.with_tiles(threshold=0.05)  # shares the adjacency's records
    else:
        dtype = torch.float64
    conv = fg.GCNConv(96, WIDTH).to(dtype)
    for _ in range(3):
        x = torch.randn(200, 96, dtype=dtype, requires_grad=True)
        conv(x, graph).sum().backward()
    assert conv.__dict__.get("_fgplugin_layer_call") is not None
    assert route_anywhere.probed == []


def test_the_sparse_forms_timing_runs_its_products_on_the_chosen_route(route_anywhere, monkeypatch):
    """The input cache's dense aggregation is made once and times nothing, but the sparse form's
    timing (fgplugin.sparse_input) runs products that repeat every step if that form is kept: they
    choose their route in its untimed first run, so that the timed runs are the steps' own."""
    import fgplugin.pyg as fg

    seen = []
    batch_cost_ms = autotune._batch_cost_ms

    def spying(run, n, device):
        seen.append(cusparse.choice_at(adj, WIDTH))
        return batch_cost_ms(run, n, device)

    monkeypatch.setattr(autotune, "_batch_cost_ms", spying)
    g = torch.Generator().manual_seed(8)
    x = (torch.rand(300, 300, generator=g) < 0.01).float()  # bag-of-words-like: a sparse form's candidate
    y = torch.randint(0, 4, (300,), generator=g)
    adj = clustered_case(8, n_src=300).adjacency(threshold="auto")
    conv = fg.GCNConv(300, WIDTH)
    for _ in range(3):
        F.cross_entropy(conv(x, adj)[:, :4], y).backward()
    assert seen and all(isinstance(choice, bool) for choice in seen), seen
    assert route_anywhere.probed == [WIDTH]
