"""Mixed precision: the drop-in layers under ``torch.autocast`` (bf16 and fp16) aggregate in 16 bits
with float32 accumulation, forward and backward, and stay within 16-bit rounding of the stock layer
run in float64 with the same weights. CPU everywhere, CUDA where a GPU is visible."""
import copy

import pytest
import torch

from fgplugin.testing import clustered_case, rel_error

from conftest import require_dgl

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Relative error against float64 of a 16-bit aggregation (8 and 11 significant bits, float32 sums)
# behind a 16-bit GEMM; measured at most 3.8e-3 (bf16) and 4.8e-4 (fp16) on the CPU here.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
FEATURES = 24


def _pyg_layers():
    import torch_geometric.nn as stock
    import fgplugin.pyg as ours
    return [(name, lambda m, make=make: make(m), stock, ours) for name, make in (
        ("GCNConv", lambda m: m.GCNConv(FEATURES, 16)),
        ("SAGEConv", lambda m: m.SAGEConv(FEATURES, 16)),
        ("SGConv", lambda m: m.SGConv(FEATURES, 16, K=2)),
        ("LGConv", lambda m: m.LGConv()),
    )]


def _run(layer, graph, x, upstream, dtype=None):
    """The layer's output and the gradients of ``<output, upstream>`` for ``x`` and its parameters,
    under ``torch.autocast(dtype)`` when ``dtype`` is given."""
    x = x.clone().requires_grad_()
    layer.zero_grad()
    if dtype is None:
        out = layer(x, graph)
    else:
        with torch.autocast(x.device.type, dtype=dtype):
            out = layer(x, graph)
    (out.to(upstream.dtype) * upstream).sum().backward()
    return out, [x.grad] + [p.grad for p in layer.parameters()]


def _check(stock, ours, graph, x, dtype):
    """Ours under autocast against stock in float64: output and every gradient within 16-bit
    rounding."""
    reference = copy.deepcopy(stock).double()
    with torch.no_grad():
        shape = reference(x.double(), graph).shape
    upstream = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(x.device)
    ref_out, ref_grads = _run(reference, graph, x.double(), upstream.double())
    out, grads = _run(ours, graph, x, upstream, dtype)
    assert out.dtype == dtype  # the bias is added in 16 bits, as nn.Linear adds it under autocast
    assert rel_error(out.double(), ref_out) <= TOLERANCE[dtype]
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32  # parameters and x stay float32, as autocast leaves them
        assert rel_error(got.double(), want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("index", range(4))
def test_pyg_layers_under_autocast_match_float64_stock(index, dtype, device):
    name, make, stock_module, ours_module = _pyg_layers()[index]
    case = clustered_case(7, n_src=300)
    stock, ours = make(stock_module).to(device), make(ours_module).to(device)
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(300, FEATURES, generator=torch.Generator().manual_seed(1)).to(device)
    edge_index = case.edge_index.to(device)
    _check(stock, ours, edge_index, x, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_aggregation_itself_runs_in_16_bits(dtype, device):
    """LGConv has no weights: under autocast its output is in the autocast dtype and differs from
    the float32 aggregation by 16-bit rounding (stock PyG aggregates in float32 there)."""
    import fgplugin.pyg as ours
    case = clustered_case(8, n_src=300)
    x = torch.randn(300, FEATURES, generator=torch.Generator().manual_seed(1)).to(device)
    conv, edge_index = ours.LGConv(), case.edge_index.to(device)
    full = conv(x, edge_index)
    with torch.autocast(device, dtype=dtype):
        half = conv(x, edge_index)
    assert half.dtype == dtype
    assert 1e-5 < rel_error(half.double(), full.double()) <= TOLERANCE[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["GraphConv", "SAGEConv", "SGConv"])
def test_dgl_layers_under_autocast_match_float64_stock(name, dtype, device):
    dgl = require_dgl()
    import fgplugin.dgl as ours
    make = {"GraphConv": lambda m: m.GraphConv(FEATURES, 16, allow_zero_in_degree=True),
            "SAGEConv": lambda m: m.SAGEConv(FEATURES, 16, "mean"),
            "SGConv": lambda m: m.SGConv(FEATURES, 16, k=2, allow_zero_in_degree=True)}[name]
    case = clustered_case(9, n_src=300)
    graph = dgl.graph((case.edge_index[0], case.edge_index[1]), num_nodes=300)
    try:
        graph = graph.to(device)
    except Exception as err:  # DGL's PyPI builds are CPU-only
        pytest.skip(f"this DGL build cannot use {device}: {err}")
    stock, ours_layer = make(dgl.nn).to(device), make(ours).to(device)
    ours_layer.load_state_dict(stock.state_dict())
    x = torch.randn(300, FEATURES, generator=torch.Generator().manual_seed(1)).to(device)
    _check(_GraphFirst(stock), _GraphFirst(ours_layer), graph, x, dtype)


class _GraphFirst(torch.nn.Module):
    """A DGL layer called as ``layer(x, graph)``, like the PyG ones."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, graph):
        return self.layer(graph, x)


@pytest.mark.parametrize("device", DEVICES)
def test_a_cached_sgconv_trained_under_autocast_evaluates_without_it(device):
    """A cached SGConv keeps its propagated features in float32 as stock's does, so a call
    without autocast after the first one under it works, for PyG and DGL alike; a bias added
    without a weight stays in the autocast dtype."""
    import torch_geometric.nn as stock_pyg

    import fgplugin.pyg as pyg_ours
    case = clustered_case(9, n_src=300)
    x = torch.randn(300, FEATURES, generator=torch.Generator().manual_seed(1)).to(device)
    edge_index = case.edge_index.to(device)
    stock, ours = stock_pyg.SGConv(FEATURES, 16, K=2, cached=True).to(device), \
        pyg_ours.SGConv(FEATURES, 16, K=2, cached=True).to(device)
    ours.load_state_dict(stock.state_dict())
    for layer in (stock, ours):
        with torch.autocast(device, dtype=torch.bfloat16):
            layer(x, edge_index)
    assert ours._cached_x.dtype == stock._cached_x.dtype == torch.float32
    assert rel_error(ours(x, edge_index), stock(x, edge_index)) <= 1e-5
    dgl = require_dgl()
    import fgplugin.dgl as dgl_ours
    graph = dgl.graph((case.edge_index[0], case.edge_index[1]), num_nodes=300)
    try:
        graph = graph.to(device)
    except Exception as err:  # DGL's PyPI builds are CPU-only
        pytest.skip(f"this DGL build cannot use {device}: {err}")
    sg = dgl_ours.SGConv(FEATURES, 16, k=2, cached=True, allow_zero_in_degree=True).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        sg(graph, x)
    assert sg(graph, x).dtype == torch.float32
    conv = dgl_ours.GraphConv(FEATURES, FEATURES, weight=False, bias=True, allow_zero_in_degree=True).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        assert conv(graph, x).dtype == torch.bfloat16
