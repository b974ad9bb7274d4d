"""fgplugin.layer_calls: a drop-in layer's repeated call runs what its previous call decided, with
the same ops as the full path (bit for bit the same output and gradients), and anything that
changes a decision or the result takes the full path again."""
import copy
import gc
import pickle
import weakref

import pytest
import torch

pytest.importorskip("torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402

import fgplugin  # noqa: E402
import fgplugin.pyg as fp  # noqa: E402
from fgplugin import layer_calls  # noqa: E402
from fgplugin.pyg import gcn_conv  # noqa: E402
from fgplugin.testing import random_graph_case, rel_error  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
IN, OUT = 16, 5
# a layer whose weight narrows the features aggregates x W, one that widens them aggregates x first
NARROWING, WIDENING = (IN, OUT), (OUT, IN)
KIND = {NARROWING: layer_calls.TRANSFORMED, WIDENING: layer_calls.AGGREGATED}
# the padding widens x W: a layer that aggregates first has none to pad
PADDINGS = [(NARROWING, False), (NARROWING, True), (WIDENING, False)]


def _setup(device, graph="tiled", cached=False, channels=NARROWING):
    """A GCNConv (random bias) and a graph of 60 nodes: a weighted ``TiledAdjacency`` or an
    unweighted ``edge_index``."""
    case = random_graph_case(0, n_src=60, weighted=graph == "tiled")
    conv = fp.GCNConv(*channels, cached=cached).to(device)
    with torch.no_grad():
        conv.bias.normal_()
    return conv, case.adjacency().to(device) if graph == "tiled" else case.edge_index.to(device)


def _stock(conv, x, graph):
    """The stock PyG layer with conv's parameters and settings on ``graph`` (an edge_index, or a
    TiledAdjacency as its edges and current weights)."""
    stock = pyg_nn.GCNConv(conv.in_channels, conv.out_channels, improved=conv.improved,
                           add_self_loops=conv.add_self_loops, normalize=conv.normalize,
                           bias=conv.bias is not None).to(x.device)
    with torch.no_grad():
        stock.lin.weight.copy_(conv.lin.weight)
        if conv.bias is not None:
            stock.bias.copy_(conv.bias)
    if isinstance(graph, fgplugin.TiledAdjacency):
        targets = torch.repeat_interleave(torch.arange(graph.shape[0], device=x.device), graph.rowptr.diff())
        return stock(x.detach(), torch.stack([graph.col.long(), targets]), graph.values.detach())
    return stock(x.detach(), graph)


def _spy_full_path(monkeypatch) -> list:
    """Counts the layer calls that take the full path (their call of ``aggregate``)."""
    calls = []
    original = gcn_conv.aggregate

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(gcn_conv, "aggregate", spy)
    return calls


def _full_path(conv, x, g):
    """conv(x, g) by the full path (what the layer kept dropped first)."""
    layer_calls.forget(conv)
    return conv(x, g)


def _same_as_full_path(conv, x, g, out, new_input=False):
    """Asserts that ``out``, a repeated call's, and its gradients of ``x`` (where it needs one) and of
    the layer's weight and bias are the full path's bit for bit; returns the full path's output.
    ``new_input``: the full path gets a copy of ``x``, as it gets an input that is new at every
    call (the same ``x`` again may be a constant input, which the input cache keeps)."""
    leaves = (x, conv.lin.weight, conv.bias) if x.requires_grad else (conv.lin.weight, conv.bias)
    grad = torch.randn_like(out)
    out.backward(grad)
    kept_grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    again = _full_path(conv, x.clone() if new_input else x, g)
    again.backward(grad)
    assert torch.equal(out, again)
    assert all(torch.equal(a, t.grad) for a, t in zip(kept_grads, leaves))
    return again


def _padded_as_on_cuda(monkeypatch):
    """Products padded as the CUDA kernels pad wide ones (the graphs here are too small for it)."""
    monkeypatch.setattr(fgplugin.aggregation.Aggregation, "vector_width", lambda self, features, dtype: features + 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", ["tiled", "edge_index"])
@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("channels, padded", PADDINGS)
def test_a_hidden_layer_repeats_its_decision_bit_for_bit(device, graph, cached, padded, channels, monkeypatch):
    conv, g = _setup(device, graph, cached, channels)
    if padded:
        _padded_as_on_cuda(monkeypatch)
    full = _spy_full_path(monkeypatch)
    for step in range(3):
        x = torch.randn(60, channels[0], device=device, requires_grad=True)  # a hidden layer's input
        out = conv(x, g)
        assert len(full) == (step == 0)  # decided once, then repeated
        assert conv.__dict__["_fgplugin_layer_call"].decision.kind == KIND[channels]
        if step and channels == NARROWING and fgplugin.extension_status().loaded:
            # repeated in one step from C++ (KeptSpmm.transformed)
            assert conv.__dict__["_fgplugin_layer_call"].decision.product() is not None
        _same_as_full_path(conv, x, g, out)
        conv.lin.weight.grad = conv.bias.grad = None
        assert rel_error(out, _stock(conv, x, g)) <= 1e-5
        full.clear()  # the full path decided again: the next step repeats it


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("graph", ["tiled", "edge_index"])
@pytest.mark.parametrize("channels, padded", PADDINGS)
def test_a_first_layer_after_dropout_repeats_its_decision_bit_for_bit(device, graph, padded, channels, monkeypatch):
    """PyG's gcn.py drops out the input features: the first layer sees a new tensor that needs no
    gradient at every step, which the input cache cannot keep; its call is decided once (the main
    job's 64 -> 64 layer widens nothing: it aggregates first)."""
    conv, g = _setup(device, graph, cached=True, channels=channels)
    if padded:
        _padded_as_on_cuda(monkeypatch)
    features = torch.randn(60, channels[0], device=device)
    full = _spy_full_path(monkeypatch)
    for step in range(3):
        x = torch.nn.functional.dropout(features, 0.5)
        out = conv(x, g)
        assert len(full) == (step == 0)  # decided once, then repeated
        assert conv.__dict__["_fgplugin_layer_call"].decision.kind == KIND[channels]
        if step and channels == NARROWING and fgplugin.extension_status().loaded:
            # repeated in one step from C++ (KeptSpmm.transformed)
            assert conv.__dict__["_fgplugin_layer_call"].decision.product() is not None
        _same_as_full_path(conv, x, g, out, new_input=True)
        conv.lin.weight.grad = conv.bias.grad = None
        assert rel_error(out, _stock(conv, x, g)) <= 1e-5
        full.clear()
    assert not fgplugin.input_cache.of(conv).holds


@pytest.mark.parametrize("channels", [NARROWING, WIDENING])
def test_a_batched_input_takes_the_full_path_every_call(channels, monkeypatch):
    """PyG's static graphs: ``x`` of ``[batch, nodes, features]`` aggregates over its node
    dimension, which no kept call runs; every call decides afresh."""
    conv, g = _setup("cpu", channels=channels)
    full = _spy_full_path(monkeypatch)
    for step in range(3):
        x = torch.randn(2, 60, channels[0], requires_grad=True)
        out = conv(x, g)
        assert len(full) == step + 1
        assert all(rel_error(out[i], _stock(conv, x[i], g)) <= 1e-5 for i in range(2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", [NARROWING, WIDENING])
def test_a_constant_input_after_new_ones_is_kept_by_the_input_cache(device, channels, monkeypatch):
    """A repeated call for inputs that are new at every call does not hide a constant input from
    the input cache (evaluation with gradients on, after training with input dropout): the same
    tensor twice takes the full path, which keeps its aggregation."""
    conv, g = _setup(device, channels=channels)
    full = _spy_full_path(monkeypatch)
    for _ in range(2):
        conv(torch.nn.functional.dropout(torch.randn(60, channels[0], device=device), 0.5), g)
    assert len(full) == 1
    full.clear()
    x = torch.randn(60, channels[0], device=device)
    outs = [conv(x, g) for _ in range(5)]
    assert len(full) == 2  # the second call sees x again: full path (noted); the third keeps A x
    assert fgplugin.input_cache.of(conv).holds
    assert conv.__dict__["_fgplugin_layer_call"].decision.kind == layer_calls.KEPT_INPUT
    assert all(rel_error(o, _stock(conv, x, g)) <= 1e-5 for o in outs)


@pytest.mark.skipif(not fgplugin.input_cache.SEES_SAVED_TENSOR_HOOKS,
                    reason="this torch cannot be asked for saved-tensor hooks: the cache cannot step aside under them")
@pytest.mark.parametrize("hooks", ["save_on_cpu", "checkpoint"])
@pytest.mark.parametrize("channels", [NARROWING, WIDENING])
def test_a_kept_input_is_not_bypassed_after_a_new_input_under_saved_tensor_hooks(hooks, channels):
    """The input cache holds ``A x`` but steps aside under saved-tensor hooks: a call with a new input
    there must not keep a call that the next call with ``x`` would repeat instead of the cache's."""
    conv, g = _setup("cpu", channels=channels)
    x = torch.randn(60, channels[0])
    for _ in range(2):
        conv(x, g)
    assert fgplugin.input_cache.of(conv).holds
    new_input = torch.nn.functional.dropout(x, 0.5)
    if hooks == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu():
            conv(new_input, g)
    else:
        torch.utils.checkpoint.checkpoint(conv, new_input, g, use_reentrant=False)
    out = conv(x, g)
    assert conv.__dict__["_fgplugin_layer_call"].decision.kind == layer_calls.KEPT_INPUT
    assert torch.equal(out, _full_path(conv, x, g))


@pytest.mark.parametrize("padded", [False, True])
def test_a_hidden_layers_repeated_call_saves_what_the_full_path_does(padded, monkeypatch):
    """A hidden layer's repeated call saves for the backward what its full path saves: a
    checkpointed layer's recomputation (which matches the tensors it saves with the forward's, and
    follows a first call that took the full path) works from the first step; x's gradient uses
    the weight the forward used when the weight's data is replaced before the backward; with the
    weight frozen, x is neither kept alive nor checked for writes until the backward."""
    if padded:
        _padded_as_on_cuda(monkeypatch)
    conv, g = _setup("cpu")
    full = _spy_full_path(monkeypatch)
    x = torch.randn(60, IN, requires_grad=True)
    for step in range(3):  # step 0: the forward takes the full path, its recomputation the kept call
        out = torch.utils.checkpoint.checkpoint(conv, x, g, use_reentrant=False)
        out.sum().backward()
    expected = _full_path(conv, x, g)  # the reference: full path, then the weight's data replaced
    (want,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
    full.clear()
    out = conv(x, g)
    assert not full  # repeated
    conv.lin.weight.data = conv.lin.weight.data * 2
    (got,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert torch.equal(got, want)
    conv.lin.weight.requires_grad_(False)
    _full_path(conv, x * 1, g)  # decided with a frozen weight; the next call repeats it
    hidden = x * 1
    out = conv(hidden, g)
    assert len(full) == 1  # the call above, not this one
    alive = weakref.ref(hidden)
    with torch.no_grad():
        hidden.mul_(2)  # the matrix product's node saves it only where W needs a gradient: no error
    del hidden
    assert alive() is None
    out.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_the_first_layer_repeats_its_kept_input_bit_for_bit(device, monkeypatch):
    conv, g = _setup(device)
    x = torch.randn(60, IN, device=device)  # the constant input: its aggregation is kept
    full = _spy_full_path(monkeypatch)
    outs = [conv(x, g) for _ in range(4)]
    assert len(full) == 2  # the first call notes x, the second keeps A x (and decides), then repeats
    assert fgplugin.input_cache.of(conv).holds
    assert all(torch.equal(outs[1], o) for o in outs[2:])
    again = _same_as_full_path(conv, x, g, outs[-1])
    assert rel_error(again, _stock(conv, x, g)) <= 1e-5
    with torch.no_grad():
        x.mul_(2)  # a new x for the input cache: its kept aggregation no longer applies
    changed = conv(x, g)
    assert rel_error(changed, _stock(conv, x, g)) <= 1e-5


def _bag_of_words_layer(device):
    """A GCNConv (random bias) over 300 mostly-zero input features, its input and a weighted graph
    of 60 nodes."""
    features = 300
    _, g = _setup(device)
    conv = fp.GCNConv(features, OUT).to(device)
    with torch.no_grad():
        conv.bias.normal_()
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(60, features, generator=gen) * (torch.rand(60, features, generator=gen) < 0.02)).to(device)
    return conv, g, x


@pytest.mark.parametrize("device", DEVICES)
def test_the_first_layer_repeats_its_sparse_kept_input_bit_for_bit(device, monkeypatch):
    """A mostly-zero constant input kept as a sparse matrix (fgplugin.sparse_input): repeated calls
    run ``A (x W) + b`` on it with the full path's ops (the weight padded to the decided width), and
    serve the form the cache holds at the call (a trial switches them), whichever form the call
    was decided on."""
    conv, g, x = _bag_of_words_layer(device)
    monkeypatch.setattr(fgplugin.config.settings, "sparse_input", "1")  # the sparse form wherever it applies
    _padded_as_on_cuda(monkeypatch)
    full = _spy_full_path(monkeypatch)
    widths, transformed = [], fgplugin.aggregation._transformed_product
    monkeypatch.setattr(fgplugin.aggregation, "_transformed_product",
                        lambda graph, x, weight, bias, width, *args: widths.append(width)
                        or transformed(graph, x, weight, bias, width, *args))
    outs = [conv(x, g) for _ in range(4)]
    assert len(full) == 2  # the first call notes x, the second keeps it sparse (and decides), then repeats
    assert widths == [OUT + 3] * 4  # every call's product (the first on x itself), the repeated ones too, padded
    cache = fgplugin.input_cache.of(conv)
    assert isinstance(cache.value, fgplugin.sparse_input.SparseInput)
    decision = conv.__dict__["_fgplugin_layer_call"].decision
    assert decision.kind == layer_calls.KEPT_INPUT and decision.width == OUT + 3
    assert all(torch.equal(outs[1], o) for o in outs[2:])
    again = _same_as_full_path(conv, x, g, outs[-1])
    expected = _stock(conv, x, g)
    assert rel_error(again, expected) <= 1e-5
    sparse, dense = cache.value, fgplugin.ops.spmm(g, x, *g.norm("gcn", dtype=x.dtype))
    for decided_on in (sparse, dense):
        for served in (sparse, dense):
            cache._value = decided_on
            _full_path(conv, x, g)  # a call decided on this form
            assert conv.__dict__["_fgplugin_layer_call"].decision.width == OUT + 3
            cache._value = served
            full.clear()
            out = conv(x, g)
            assert not full  # served by the repeated call, in the form held now
            assert torch.equal(out, _full_path(conv, x, g)) and rel_error(out, expected) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["first dense", "first sparse", "hidden", "hidden without KeptSpmm"])
def test_edge_values_that_come_to_need_a_gradient_get_it(device, layer, monkeypatch):
    """Edge values set to need a gradient after the layer kept its call (``requires_grad_``
    changes no version): the next call takes the full path, which computes the scales and any
    kept input afresh, and the edge values get the full path's gradient. A first layer keeps its
    input in either form; a hidden layer runs its product from the extension's ``KeptSpmm`` or,
    without one, through ``fgplugin.spmm``."""
    conv, g, x = _bag_of_words_layer(device)
    monkeypatch.setattr(fgplugin.config.settings, "sparse_input", "1" if layer == "first sparse" else "0")
    if layer.startswith("hidden"):
        x = x.clone().requires_grad_()
    if layer == "hidden without KeptSpmm":
        monkeypatch.setattr(fgplugin._extension, "kept_spmm", None)
    for _ in range(3):
        conv(x, g)
    assert conv.__dict__.get("_fgplugin_layer_call") is not None
    g.values.requires_grad_()
    conv(x, g).square().sum().backward()
    assert g.values.grad is not None
    kept_grad, g.values.grad = g.values.grad, None
    _full_path(conv, x, g).square().sum().backward()
    assert torch.equal(kept_grad, g.values.grad)


def _replace_weight(conv, g, x):
    conv.lin.weight = torch.nn.Parameter(torch.randn_like(conv.lin.weight))


def _write_weight(conv, g, x):
    with torch.no_grad():
        conv.lin.weight.mul_(-2)


def _drop_bias(conv, g, x):
    conv.bias = None


def _write_edge_values(conv, g, x):
    with torch.no_grad():
        g.values.mul_(3)


def _improved(conv, g, x):
    conv.improved = True


def _no_self_loops(conv, g, x):
    conv.add_self_loops = False


def _no_normalization(conv, g, x):
    conv.normalize = conv.add_self_loops = False  # the stock layer adds no loops to an unnormalized graph


CHANGES = [_replace_weight, _write_weight, _drop_bias, _write_edge_values, _improved, _no_self_loops,
           _no_normalization]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("constant", [False, True], ids=["hidden", "first"])
@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("channels", [NARROWING, WIDENING])
def test_a_change_to_the_layer_or_graph_is_seen(device, constant, change, channels):
    conv, g = _setup(device, channels=channels)
    x = torch.randn(60, channels[0], device=device, requires_grad=not constant)
    for _ in range(3):
        conv(x, g)
    assert conv.__dict__.get("_fgplugin_layer_call") is not None
    change(conv, g, x)
    for _ in range(3):  # a constant x: its aggregation is kept again from the second call
        out = conv(x, g)
        assert rel_error(out, _stock(conv, x, g)) <= 1e-5
    assert torch.equal(out, _full_path(conv, x, g))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", [NARROWING, WIDENING])
def test_hooks_grad_mode_autocast_and_switches_take_the_full_path(device, channels, monkeypatch):
    conv, g = _setup(device, graph="edge_index", channels=channels)  # the stock propagate() takes an edge_index
    x = torch.randn(60, channels[0], device=device, requires_grad=True)
    for _ in range(2):
        conv(x, g)
    full = _spy_full_path(monkeypatch)
    seen = []
    handle = conv.lin.register_forward_hook(lambda *args: seen.append(1))
    conv(x, g)
    assert seen and full  # the linear map's hook ran, on the full path
    handle.remove()
    full.clear()
    conv(x, g)
    assert not full  # the kept call still holds: nothing it read changed
    handle = conv.register_propagate_forward_hook(lambda *args: seen.append(2))
    conv(x, g)
    assert 2 in seen  # the stock propagate() ran, with its hook
    handle.remove()
    conv(x, g)
    full.clear()
    with torch.no_grad():
        out = conv(x, g)
        assert full and not out.requires_grad
        full.clear()
        conv(torch.randn_like(x).requires_grad_(), g)  # evaluations decide afresh, new inputs too
    assert full
    full.clear()
    with torch.autocast(device, dtype=torch.bfloat16):
        out = conv(x, g)
    assert full and out.dtype == torch.bfloat16
    full.clear()
    previous = fgplugin.set_input_cache(False)
    try:
        conv(x, g)
    finally:
        fgplugin.set_input_cache(previous)
    assert full


@pytest.mark.parametrize("device", DEVICES)
def test_a_hidden_layers_kept_product_is_dropped_where_it_no_longer_serves(device, monkeypatch):
    if not fgplugin.extension_status().loaded:
        pytest.skip("the kept product is the C++ extension's KeptSpmm, which is not built here")
    conv, g = _setup(device)
    x = torch.randn(60, IN, device=device, requires_grad=True)
    for _ in range(2):
        conv(x, g)
    assert conv.__dict__["_fgplugin_layer_call"].decision.product() is not None
    full = _spy_full_path(monkeypatch)
    g._calls.clear()  # the adjacency let go of its kept products (as for new edge values)
    out = conv(x, g)
    assert full and torch.equal(out, _full_path(conv, x, g))
    full.clear()
    conv(x, g)
    assert not full  # decided again, with the product's new kept call
    previous = fgplugin.set_cusparse("1")  # a switch the product's own lookup would see
    try:
        out = conv(x, g)
    finally:
        fgplugin.set_cusparse(previous)
    assert full and rel_error(out, _stock(conv, x, g)) <= 1e-5
    conv(x, g)
    full.clear()
    g.values.requires_grad_()  # in place: no version changes, and the product must record their gradient
    out = conv(x, g)
    assert full
    out.sum().backward()
    assert g.values.grad is not None and g.values.grad.abs().sum() > 0
    assert rel_error(out, _stock(conv, x, g)) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_another_graph_or_a_reset_cache_is_used(device):
    conv, g = _setup(device, cached=True, graph="edge_index")
    x = torch.randn(60, IN, device=device, requires_grad=True)
    for _ in range(3):
        first = conv(x, g)
    other = random_graph_case(5, n_src=60)
    # cached=True ignores a later graph, like the stock layer; after a reset it takes the new one
    assert torch.equal(conv(x, other.edge_index.to(device)), first)
    conv._cached_edge_index = None
    out = conv(x, other.edge_index.to(device))
    stock = pyg_nn.GCNConv(IN, OUT).to(device)
    with torch.no_grad():
        stock.lin.weight.copy_(conv.lin.weight)
        stock.bias.copy_(conv.bias)
    assert rel_error(out, stock(x.detach(), other.edge_index.to(device))) <= 1e-5
    tiled = other.adjacency().to(device)
    uncached = fp.GCNConv(IN, OUT).to(device)
    uncached.load_state_dict(conv.state_dict())
    for _ in range(2):
        uncached(x, g)
    assert rel_error(uncached(x, tiled), out) <= 1e-5  # another graph object: decided anew


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_call_keeps_no_graph_alive_and_copies_drop_it(device):
    conv, g = _setup(device)
    x = torch.randn(60, IN, device=device, requires_grad=True)
    for _ in range(3):
        out = conv(x, g)
    for twin in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        assert twin.__dict__.get("_fgplugin_layer_call") is None
        assert torch.equal(twin(x, g), out)
    ref = weakref.ref(g)
    del g, out
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_call_lets_go_of_a_reset_cache_a_replaced_weight_and_freed_scales(device):
    conv, edge_index = _setup(device, graph="edge_index", cached=True)
    for _ in range(3):
        conv(torch.randn(60, IN, device=device, requires_grad=True), edge_index)
    adj = weakref.ref(conv._cached_edge_index.adj)
    conv._cached_edge_index = None  # PyG's way to let go of a cached graph
    del edge_index
    gc.collect()
    assert adj() is None
    conv, g = _setup(device)
    for _ in range(3):
        conv(torch.randn(60, IN, device=device, requires_grad=True), g)
    weight, scales = weakref.ref(conv.lin.weight), [weakref.ref(t) for t in g.norm("gcn", dtype=torch.float32)
                                                     if isinstance(t, torch.Tensor)]
    conv.lin = torch.nn.Linear(IN, OUT, bias=False).to(device)
    del g
    gc.collect()
    assert weight() is None and all(s() is None for s in scales)


@pytest.mark.parametrize("device", DEVICES)
def test_a_weight_reshaped_through_data_or_an_inference_graph_is_served_right(device):
    conv, g = _setup(device)
    x = torch.randn(60, IN, device=device, requires_grad=True)
    for _ in range(3):
        conv(x, g)
    for out in (3, 32):  # 32 widens the features: the full path aggregates first
        conv.lin.weight.data = torch.randn(out, IN, device=device)
        conv.bias.data = torch.randn(out, device=device)
        conv.out_channels = out
        kept = conv(x, g)
        assert torch.equal(kept, _full_path(conv, x, g)) and rel_error(kept, _stock(conv, x, g)) <= 1e-5
    with torch.inference_mode():
        edge_index = random_graph_case(0, n_src=60).edge_index.to(device)
    conv = fp.GCNConv(IN, OUT).to(device)
    for constant in (False, True):
        x = torch.randn(60, IN, device=device, requires_grad=not constant)
        for _ in range(3):  # no version to key a kept call on: every call takes the full path
            assert rel_error(conv(x, edge_index), _stock(conv, x, edge_index.clone())) <= 1e-5


class _RoundedWeight(torch.nn.Parameter):
    """A weight whose transpose (what GCNConv multiplies by) is rounded, as a fake-quantized
    weight's would be."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
            return torch.round(out * 4) / 4 if func is torch.Tensor.t else out


@pytest.mark.parametrize("device", DEVICES)
def test_a_weight_with_a_torch_function_of_its_own_sees_every_repeated_call(device):
    conv, g = _setup(device)
    base = conv.lin.weight.detach().clone()
    conv.lin.weight = _RoundedWeight(base.clone())
    x = torch.randn(60, IN, device=device, requires_grad=True)
    outs = [conv(x, g) for _ in range(3)]
    assert conv.__dict__.get("_fgplugin_layer_call") is not None  # repeated as decided
    conv.lin.weight = torch.nn.Parameter(torch.round(base * 4) / 4)
    want = _full_path(conv, x, g)
    assert all(torch.equal(out, want) for out in outs)


class _DoubledLinear(torch.nn.Linear):
    """A linear map of another kind (not ``x W^T``): the layer must apply the module itself."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("freed", [True, False], ids=["freed", "alive"])
def test_a_linear_map_of_another_kind_is_seen(device, freed):
    # A linear map of another kind, sharing the weight, in place of the one a call was kept with:
    # made where the freed one was (freed: Python then gives it the old one's id, which a check
    # by id alone would take for the kept map), or while that one lives on elsewhere (alive)
    conv, g = _setup(device)
    weight = conv.lin.weight
    x = torch.randn(60, IN, device=device, requires_grad=True)
    held, reused = [], 0
    for _ in range(10):
        conv.lin = torch.nn.Linear(IN, OUT, bias=False).to(device)
        conv.lin.weight = weight
        for _ in range(2):
            conv(x, g)
        assert conv.__dict__.get("_fgplugin_layer_call") is not None
        old_id = id(conv.lin)
        if not freed:
            held.append(conv.lin)
        del conv.lin
        conv.lin = _DoubledLinear(IN, OUT, bias=False).to(device)
        conv.lin.weight = weight
        reused += id(conv.lin) == old_id
        out = conv(x, g)
        assert torch.equal(out, _full_path(conv, x, g))
        # A (2 x W^T) + b, from the stock layer's A x W^T + b
        assert rel_error(out, 2 * (_stock(conv, x, g) - conv.bias) + conv.bias) <= 1e-5
    # freed: else the test shows nothing, the case it guards against did not occur
    assert reused if freed else not reused


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("constant", [False, True], ids=["hidden", "first"])
def test_graphs_in_turns_are_each_aggregated_over(device, constant):
    conv, _ = _setup(device)
    graphs = [random_graph_case(seed, n_src=60).edge_index.to(device) for seed in (1, 2)]
    x = torch.randn(60, IN, device=device, requires_grad=not constant)
    for step in range(6):
        g = graphs[step % 2]
        assert rel_error(conv(x, g), _stock(conv, x, g)) <= 1e-5


def test_a_kept_call_pins_its_graph_inputs_data_only_while_the_input_lives():
    # the key stamps the graph input's data address, whose storage it holds so that no new data can
    # take the address; once the input is freed that storage is let go of too
    conv, edge_index = _setup("cpu", graph="edge_index")
    x = torch.randn(60, IN, requires_grad=True)
    for _ in range(3):
        conv(x, edge_index)
    kept = conv.__dict__["_fgplugin_layer_call"]
    assert kept.pinned is not None
    del edge_index
    gc.collect()
    assert kept.pinned is None
