"""fgplugin.layer_graphs: a GCN layer's repeated training call replayed from CUDA graphs trains as
the eager calls do (losses, weights, gradients), returns nothing that a later replay overwrites,
and serves what a graph cannot (two forwards before one backward, a second backward, a
differentiable backward, a moved weight) by running its ops again; off the GPU and where switched
off nothing is captured."""
import copy

import pytest
import torch
import torch.nn.functional as F

import fgplugin
from fgplugin import layer_graphs
from fgplugin.config import settings
from fgplugin.testing import clustered_case

pytest.importorskip("torch_geometric")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="layer graphs are CUDA graphs: they need a CUDA GPU")
N, FEATURES, HIDDEN, CLASSES = 600, 24, 32, 5


class _GCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        import fgplugin.pyg as fg
        self.conv1, self.conv2 = fg.GCNConv(FEATURES, HIDDEN), fg.GCNConv(HIDDEN, CLASSES)

    def forward(self, x, edge_index):
        return self.conv2(F.dropout(self.conv1(x, edge_index).relu(), 0.5, self.training), edge_index)


def _problem(device):
    case = clustered_case(5, n_src=N)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, FEATURES, generator=g).to(device)
    y = torch.randint(0, CLASSES, (N,), generator=g).to(device)
    train = (torch.rand(N, generator=g) < 0.3).to(device)
    return x, case.edge_index.to(device), y, train


def _graphs(layer):
    state = layer.__dict__.get(layer_graphs._STATE)
    return state if isinstance(state, layer_graphs.LayerGraph) else None


def _train(model, x, edge_index, y, train, steps, mode, zero_grad=True, hook=None):
    """Losses and the final weights of ``steps`` Adam steps with layer graphs in ``mode``."""
    previous = fgplugin.set_layer_graphs(mode)
    try:
        torch.manual_seed(7)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        losses = []
        for _ in range(steps):
            if zero_grad:
                opt.zero_grad(set_to_none=True)
            out = model(x, edge_index)
            loss = F.cross_entropy(out[train], y[train])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return torch.tensor(losses), [p.detach().clone() for p in model.parameters()]
    finally:
        fgplugin.set_layer_graphs(previous)


def _pair(device="cuda"):
    x, edge_index, y, train = _problem(device)
    torch.manual_seed(0)
    model = _GCN().to(device)
    return (x, edge_index, y, train), model, copy.deepcopy(model)


@CUDA
@pytest.mark.parametrize("zero_grad", [True, False], ids=["zero_grad", "accumulating"])
def test_replayed_layers_train_as_the_eager_ones(zero_grad):
    data, model, reference = _pair()
    losses, weights = _train(model, *data, 12, "1", zero_grad)
    ref_losses, ref_weights = _train(reference, *data, 12, "0", zero_grad)
    for conv in (model.conv1, model.conv2):
        assert _graphs(conv) is not None and _graphs(conv).replays >= 5
    assert _graphs(reference.conv1) is None and _graphs(reference.conv2) is None
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    for w, r in zip(weights, ref_weights):
        torch.testing.assert_close(w, r, rtol=1e-5, atol=1e-6)


@CUDA
def test_an_evaluation_between_steps_leaves_the_graphs_serving():
    data, model, _ = _pair()
    _train(model, *data, 6, "1")
    graph = _graphs(model.conv2)
    model.eval()
    with torch.no_grad():
        model(data[0], data[1])
    model.train()
    _train(model, *data, 6, "1")
    assert _graphs(model.conv2) is graph and graph.replays >= 8


def _warmed_hidden_layer():
    """conv2 of a trained model, its graphs captured, and an input needing a gradient."""
    data, model, _ = _pair()
    _train(model, *data, 6, "1")
    assert _graphs(model.conv2) is not None
    return model.conv2, data[1]


def _h(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(N, HIDDEN, device="cuda", generator=g).requires_grad_()


def _eager(conv, h, edge_index):
    previous = fgplugin.set_layer_graphs("0")
    try:
        return conv(h, edge_index)
    finally:
        fgplugin.set_layer_graphs(previous)


@CUDA
def test_an_output_held_across_calls_is_not_overwritten():
    conv, edge_index = _warmed_hidden_layer()
    previous = fgplugin.set_layer_graphs("1")
    try:
        h1, h2 = _h(1), _h(2)
        out1 = conv(h1, edge_index)
        kept = out1.detach().clone()
        conv(h2, edge_index)
        assert _graphs(conv).replays >= 2
    finally:
        fgplugin.set_layer_graphs(previous)
    torch.testing.assert_close(out1.detach(), kept, rtol=0, atol=0)
    torch.testing.assert_close(kept, _eager(conv, h1, edge_index).detach(), rtol=1e-5, atol=1e-6)


def _grads(conv, hs, edge_index, mode, backward):
    """Gradients of the layer's weight, bias and inputs after ``backward(outputs)``."""
    previous = fgplugin.set_layer_graphs(mode)
    try:
        conv.zero_grad(set_to_none=True)
        inputs = [h.detach().clone().requires_grad_() for h in hs]
        backward([conv(h, edge_index) for h in inputs])
        return [conv.lin.weight.grad.clone(), conv.bias.grad.clone(), *(h.grad.clone() for h in inputs)]
    finally:
        fgplugin.set_layer_graphs(previous)


def _same_grads(conv, hs, edge_index, backward):
    replays = _graphs(conv).replays
    got = _grads(conv, hs, edge_index, "1", backward)
    assert _graphs(conv).replays > replays, "the graphs did not serve the call"
    for g, r in zip(got, _grads(conv, hs, edge_index, "0", backward)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@CUDA
def test_two_forwards_before_one_backward_give_the_eager_gradients():
    conv, edge_index = _warmed_hidden_layer()
    weights = torch.randn(N, CLASSES, device="cuda")
    _same_grads(conv, [_h(1), _h(2)], edge_index,
                lambda outs: ((outs[0] * weights).sum() + (outs[1] * outs[1]).sum()).backward())


@CUDA
def test_a_second_backward_of_a_retained_graph_gives_the_eager_gradients():
    conv, edge_index = _warmed_hidden_layer()

    def twice(outs):
        loss = (outs[0] ** 2).sum()
        loss.backward(retain_graph=True)
        loss.backward()

    _same_grads(conv, [_h(3)], edge_index, twice)


@CUDA
def test_a_gradient_kept_by_a_hook_is_not_overwritten():
    conv, edge_index = _warmed_hidden_layer()
    seen = []
    previous = fgplugin.set_layer_graphs("1")
    try:
        for seed in (4, 5):
            h = _h(seed)
            h.register_hook(lambda g: seen.append((g, g.clone())))
            (conv(h, edge_index) ** 2).sum().backward()
    finally:
        fgplugin.set_layer_graphs(previous)
    assert len(seen) == 2
    for held, copied in seen:
        torch.testing.assert_close(held, copied, rtol=0, atol=0)


@CUDA
def test_a_differentiable_backward_runs_the_ops_again():
    conv, edge_index = _warmed_hidden_layer()

    def grad_penalty(mode):
        previous = fgplugin.set_layer_graphs(mode)
        try:
            h = _h(6)
            (grad_h,) = torch.autograd.grad((conv(h, edge_index) ** 2).sum(), h, create_graph=True)
            conv.zero_grad(set_to_none=True)
            (grad_h ** 2).sum().backward()
            return conv.lin.weight.grad.clone()
        finally:
            fgplugin.set_layer_graphs(previous)

    torch.testing.assert_close(grad_penalty("1"), grad_penalty("0"), rtol=1e-5, atol=1e-6)


@CUDA
def test_a_weight_moved_by_a_data_write_is_read_where_it_is_now():
    conv, edge_index = _warmed_hidden_layer()
    graph = _graphs(conv)
    conv.lin.weight.data = torch.randn_like(conv.lin.weight)
    previous = fgplugin.set_layer_graphs("1")
    try:
        h = _h(7)
        out = conv(h, edge_index)
    finally:
        fgplugin.set_layer_graphs(previous)
    assert _graphs(conv) is not graph
    torch.testing.assert_close(out, _eager(conv, h, edge_index), rtol=1e-5, atol=1e-6)


@CUDA
@pytest.mark.parametrize("why", ["switched off", "auto, product too large"])
def test_nothing_is_captured_where_it_does_not_apply(why, monkeypatch):
    data, model, _ = _pair()
    if why == "switched off":
        _train(model, *data, 8, "0")
    else:
        monkeypatch.setattr(layer_graphs, "MAX_WORK", 0)
        _train(model, *data, 8, "auto")
    assert _graphs(model.conv1) is None and _graphs(model.conv2) is None


@CUDA
def test_auto_captures_a_small_graph_s_layers():
    data, model, _ = _pair()
    assert settings.layer_graphs == "auto"
    _train(model, *data, 8, "auto")
    assert _graphs(model.conv2) is not None


def test_no_layer_is_captured_off_the_gpu():
    data, model, reference = _pair("cpu")
    losses, _ = _train(model, *data, 6, "1")
    ref_losses, _ = _train(reference, *data, 6, "0")
    assert _graphs(model.conv1) is None and _graphs(model.conv2) is None
    torch.testing.assert_close(losses, ref_losses, rtol=0, atol=0)


def test_the_recomputed_gradients_are_autograd_s():
    """The backward a graph cannot serve: the ops run again and differentiated, also twice."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(7, 3, generator=g, dtype=torch.float64)

    def op(x, w, b):
        return torch.tanh(x @ w.t() + (0 if b is None else b))

    expected = torch.autograd.grad(op(x, w, b), (x, w, b), grad_out)
    got = layer_graphs._recomputed(op, x, w, b, grad_out)
    for e, r in zip(expected, got):
        torch.testing.assert_close(r, e, rtol=0, atol=0)
    assert layer_graphs._recomputed(op, x.detach(), w, None, grad_out)[0] is None
    with torch.enable_grad():  # a backward pass that creates a graph: the gradients are differentiable
        got = layer_graphs._recomputed(op, x, w, b, grad_out)
    assert all(t.requires_grad for t in got)


@pytest.mark.parametrize("value,expected", [("auto", "auto"), (False, "0"), ("on", "1")])
def test_the_switch_takes_the_three_way_spellings(value, expected):
    previous = fgplugin.set_layer_graphs(value)
    try:
        assert settings.layer_graphs == expected
    finally:
        fgplugin.set_layer_graphs(previous)
    with pytest.raises(ValueError, match="set_layer_graphs"):
        fgplugin.set_layer_graphs("sometimes")
