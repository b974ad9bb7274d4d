"""fgplugin.input_cache: a constant input's aggregation is kept and reused by the PyG layers, and
never where it would be stale or wrong (the DGL layers: test_dgl_layers.py)."""
import copy
import io
import pickle

import pytest
import torch

pytest.importorskip("torch_geometric", reason="the drop-in layers need torch_geometric")
import torch_geometric.nn as pyg_nn  # noqa: E402

import fgplugin  # noqa: E402
import fgplugin.pyg as fp  # noqa: E402
from fgplugin import input_cache  # noqa: E402

TOL = 1e-5


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.fixture
def spmm_calls(monkeypatch):
    """Counts fgplugin.ops.spmm calls (every aggregation of the layers goes through it)."""
    calls = []
    original = fgplugin.ops.spmm

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(fgplugin.ops, "spmm", counting)
    return calls


@pytest.fixture(autouse=True)
def cache_on():
    previous = fgplugin.set_input_cache(True)
    yield
    fgplugin.set_input_cache(previous)


def graph(n=60, e=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g), n


LAYERS = {
    "gcn-wide-in": lambda cls: cls(16, 4),   # in > out: stock order A (X W)
    "gcn-narrow-in": lambda cls: cls(4, 16),
    "gcn-improved": lambda cls: cls(16, 4, improved=True, cached=True),
    "sage": lambda cls: cls(16, 4),
    "sg": lambda cls: cls(16, 4, K=2),
}


def pair(config):
    name = {"gcn": "GCNConv", "sage": "SAGEConv", "sg": "SGConv"}[config.split("-")[0]]
    torch.manual_seed(0)
    stock = LAYERS[config](getattr(pyg_nn, name))
    ours = LAYERS[config](getattr(fp, name))
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def training_pair(config):
    """The graph, the stock layer and ours with its weights, their input, an Adam for each and a
    regression target."""
    ei, n = graph()
    stock, ours = pair(config)
    optimizers = (torch.optim.Adam(stock.parameters(), lr=0.05), torch.optim.Adam(ours.parameters(), lr=0.05))
    return ei, stock, ours, torch.randn(n, stock.in_channels), optimizers, torch.randn(n, stock.out_channels)


@pytest.mark.parametrize("config", LAYERS)
def test_kept_from_the_second_call_and_training_matches_stock(config, spmm_calls):
    """Call 1 remembers x, call 2 keeps A x, calls 3+ run no SpMM; five Adam steps give the
    stock layer's outputs and weights."""
    ei, stock, ours, x, (opt_s, opt_o), target = training_pair(config)
    for step in range(5):
        before = len(spmm_calls)
        out_s, out_o = stock(x, ei), ours(x, ei)
        assert rel_err(out_o, out_s) < TOL, step
        assert input_cache.of(ours).holds == (step >= 1)
        if step >= 2:
            assert len(spmm_calls) == before, f"step {step} aggregated again"
        for opt, out in ((opt_s, out_s), (opt_o, out_o)):
            opt.zero_grad()
            ((out - target) ** 2).mean().backward()
            opt.step()
    for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
        assert rel_err(p_o, p_s) < TOL, name


def test_wide_input_is_aggregated_once_at_its_own_width(spmm_calls):
    ei, n = graph()
    _, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(4):
        ours(x, ei)
    # call 1: A (X W) at 4 columns; call 2: A X at 16 (kept); calls 3-4: none
    assert [s[1] for s in spmm_calls] == [4, 16]


def test_changed_input_is_seen(spmm_calls):
    """An in-place write, a new tensor, a new graph or new edge weights each give fresh results."""
    ei, n = graph()
    w = torch.rand(ei.shape[1])
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(3):
        ours(x, ei, w)
    assert input_cache.of(ours).holds
    x.mul_(2)  # in place: _version changes
    assert rel_err(ours(x, ei, w), stock(x, ei, w)) < TOL
    w.add_(1.0)
    assert rel_err(ours(x, ei, w), stock(x, ei, w)) < TOL
    ei2, _ = graph(seed=1)
    assert rel_err(ours(x, ei2, w), stock(x, ei2, w)) < TOL
    x2 = x.clone()
    assert rel_err(ours(x2, ei, w), stock(x2, ei, w)) < TOL
    assert not input_cache.of(ours).holds


@pytest.mark.parametrize("config", LAYERS)
def test_an_input_given_new_data_is_seen(config):
    """``x.data = other`` leaves ``x``'s version counter as it was; the kept aggregation must not
    serve it (other features), and features of another width get the stock layer's error."""
    ei, stock, ours, x, _, _ = training_pair(config)
    for _ in range(3):
        ours(x, ei)
    assert input_cache.of(ours).holds
    x.data = torch.randn_like(x)
    for _ in range(2):  # the new data, then (kept again) the same
        assert rel_err(ours(x, ei), stock(x, ei)) < TOL
    x.data = torch.randn(x.shape[0], x.shape[1] + 1)
    with pytest.raises(RuntimeError) as ours_error:
        ours(x, ei)
    with pytest.raises(RuntimeError) as stock_error:
        stock(x, ei)
    assert str(ours_error.value) == str(stock_error.value)


def test_an_input_given_a_view_of_its_own_data_is_seen():
    """``x.data = x.data.t()``: the same data address and shape (square features), other strides."""
    ei, n = graph(n=16, e=80)
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(3):
        ours(x, ei)
    x.data = x.data.t()
    assert rel_err(ours(x, ei), stock(x, ei)) < TOL


@pytest.mark.parametrize("write", [lambda t: t.mul_(2), lambda t: t.data.mul_(2)], ids=["in_place", "through_data"])
@pytest.mark.parametrize("config,linear", [("sg", "lin"), ("sage", "lin_l")])
def test_a_linear_map_that_writes_to_its_input_leaves_the_kept_aggregation_intact(config, linear, write):
    """A linear map fgplugin does not apply itself (here: with a pre-hook) gets a kept ``A x`` as
    its input; a write to it, even one torch does not count, must not reach the next calls."""
    ei, n = graph()
    stock, ours = pair(config)
    for layer in (stock, ours):
        getattr(layer, linear).register_forward_pre_hook(lambda module, args: write(args[0]))
    x = torch.randn(n, 16)
    for call in range(5):
        assert rel_err(ours(x, ei), stock(x, ei)) < TOL, call
    assert input_cache.of(ours).holds


@pytest.mark.parametrize("config", ["gcn-wide-in", "gcn-narrow-in", "sg"])
def test_edge_weights_freed_after_their_call_are_not_taken_for_none(config):
    """A kept aggregation is keyed by its edge weights' tensor, weakly: once that tensor is freed
    (a temporary), a later call without edge weights must not match the dead reference."""
    ei, n = graph()
    stock, ours = pair(config)
    x = torch.randn(n, stock.in_channels)
    for _ in range(2):
        ours(x, ei)
    for _ in range(2):
        ours(x, ei, torch.rand(ei.shape[1]) + 0.5)  # kept for these weights, freed after the call
    assert rel_err(ours(x, ei), stock(x, ei)) < TOL


def test_a_layer_without_weights_returns_a_fresh_tensor_each_call():
    """LGConv on a constant input serves its kept aggregation: an in-place write to one call's
    output (an in-place activation, the user's own) must not reach the next call's."""
    ei, n = graph()
    stock, ours = pyg_nn.LGConv(), fp.LGConv()
    x = torch.randn(n, 8)
    outputs = []
    for _ in range(4):
        out = ours(x, ei)
        assert rel_err(out, stock(x, ei)) < TOL and all(out is not o for o in outputs)
        out.mul_(3.0).add_(1.0)
        outputs.append(out)
    assert input_cache.of(ours).holds


def test_never_kept_where_gradients_flow_through_the_aggregation(spmm_calls):
    ei, n = graph()
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16, requires_grad=True)
    w = torch.rand(ei.shape[1], requires_grad=True)
    for _ in range(3):
        ours(x, ei).sum().backward()
        ours(x.detach(), ei, w).sum().backward()
    assert not input_cache.of(ours).holds
    assert x.grad is not None and w.grad is not None
    x_s = x.detach().clone().requires_grad_()
    w_s = w.detach().clone().requires_grad_()
    for _ in range(3):
        stock(x_s, ei).sum().backward()
        stock(x_s.detach(), ei, w_s).sum().backward()
    assert rel_err(x.grad, x_s.grad) < TOL and rel_err(w.grad, w_s.grad) < TOL


def test_switch_inference_mode_and_memory_cap(spmm_calls, monkeypatch):
    ei, n = graph()
    _, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    fgplugin.set_input_cache(False)
    for _ in range(3):
        ours(x, ei)
    assert not input_cache.of(ours).holds and len(spmm_calls) == 3
    fgplugin.set_input_cache(True)
    with torch.inference_mode():
        for _ in range(3):
            ours(x, ei)
    assert not input_cache.of(ours).holds
    ours(x, ei).sum().backward()  # nothing kept in inference mode leaks into training
    monkeypatch.setattr(input_cache, "MAX_MEMORY_FRACTION", 0.0)
    for _ in range(3):
        ours(x, ei)
    assert not input_cache.of(ours).holds


def test_evaluation_in_inference_mode_keeps_the_training_aggregation(spmm_calls):
    """An evaluation under torch.inference_mode() between training steps runs without the cache
    and leaves what the training steps keep (a captured step reads it: dropping it would free
    memory the CUDA graph still reads)."""
    ei, n = graph()
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    ours(x, ei)
    ours(x, ei)
    kept = input_cache.of(ours).value
    assert kept is not None
    with torch.inference_mode():
        assert rel_err(ours(x, ei), stock(x, ei)) <= TOL
    assert input_cache.of(ours).value is kept
    calls = len(spmm_calls)
    ours(x, ei).sum().backward()
    assert len(spmm_calls) == calls  # the training step still reads the kept aggregation


@pytest.mark.skipif(not fgplugin.input_cache.SEES_SAVED_TENSOR_HOOKS, reason="this torch cannot be asked for "
                    "saved-tensor hooks: checkpointed models turn the input cache off (the next test)")
@pytest.mark.parametrize("config", LAYERS)
def test_checkpointed_layers_train_as_stock_from_the_first_step(config, spmm_calls):
    """Under non-reentrant activation checkpointing (saved-tensor hooks) the cache is neither
    filled nor read: the backward's recomputation must save what the forward saved, so a first
    layer trains from step 0 as the stock layer does, also after earlier unchecked steps kept
    A x, which stays kept for the unchecked calls after them."""
    ei, stock, ours, x, (opt_s, opt_o), target = training_pair(config)
    for step in range(7):
        checkpointed = step < 3 or step >= 5  # steps 3 and 4 keep A x; 5 and 6 run beside it
        kept = input_cache.of(ours).value
        before = len(spmm_calls)
        for model, opt in ((stock, opt_s), (ours, opt_o)):
            opt.zero_grad()
            out = torch.utils.checkpoint.checkpoint(model, x, ei, use_reentrant=False) if checkpointed \
                else model(x, ei)
            ((out - target) ** 2).mean().backward()
            opt.step()
        if checkpointed:
            assert input_cache.of(ours).value is kept, step
            assert len(spmm_calls) > before, step  # aggregated in the forward and again in the backward
        for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
            assert rel_err(p_o, p_s) < TOL, (step, name)
    assert input_cache.of(ours).holds
    calls = len(spmm_calls)
    ours(x, ei)
    assert len(spmm_calls) == calls  # unchecked again: the kept aggregation serves


@pytest.mark.parametrize("config", LAYERS)
def test_checkpointed_layers_with_the_cache_off_train_as_stock(config):
    """What docs/design.md says to do where torch cannot be asked for saved-tensor hooks (2.7 and
    older, where the cache would break non-reentrant checkpointing): with the cache off a
    checkpointed model trains as the stock one, on every torch."""
    ei, stock, ours, x, (opt_s, opt_o), target = training_pair(config)
    previous = fgplugin.set_input_cache(False)
    try:
        for step in range(4):
            for model, opt in ((stock, opt_s), (ours, opt_o)):
                opt.zero_grad()
                out = torch.utils.checkpoint.checkpoint(model, x, ei, use_reentrant=False)
                ((out - target) ** 2).mean().backward()
                opt.step()
            for (name, p_s), p_o in zip(stock.named_parameters(), ours.parameters()):
                assert rel_err(p_o, p_s) < TOL, (step, name)
        assert not input_cache.of(ours).holds
    finally:
        fgplugin.set_input_cache(previous)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_aggregation_kept_under_autocast_serves_only_that_precision(dtype):
    """Kept under autocast it is a 16-bit tensor: a float32 call (evaluation after mixed-precision
    training) computes its own, in float32, and the 16-bit calls keep theirs."""
    ei, n = graph()
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(2):
        with torch.autocast("cpu", dtype=dtype):
            low = ours(x, ei)
    assert low.dtype == dtype and input_cache.of(ours).value.dtype == dtype
    for _ in range(2):
        out = ours(x, ei)
        assert out.dtype == torch.float32 and rel_err(out, stock(x, ei)) <= TOL
    with torch.autocast("cpu", dtype=dtype):
        assert ours(x, ei).dtype == dtype


def test_freeing_the_input_frees_its_aggregation():
    ei, n = graph()
    _, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    ours(x, ei), ours(x, ei)
    assert input_cache.of(ours).holds
    del x
    assert not input_cache.of(ours).holds


def test_copies_start_empty_and_pickle():
    ei, n = graph()
    _, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(2):
        ours(x, ei)
    assert input_cache.of(ours).holds
    twin = copy.deepcopy(ours)
    assert not input_cache.of(twin).holds
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert not input_cache.of(loaded).holds
    assert rel_err(loaded(x, ei), ours(x, ei)) < TOL
    assert not input_cache.of(pickle.loads(pickle.dumps(ours))).holds


def test_eval_on_a_fixed_graph_reuses_the_training_aggregation(spmm_calls):
    """model.eval() changes nothing the aggregation depends on (GCN has no dropout inside)."""
    ei, n = graph()
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    ours(x, ei), ours(x, ei)
    ours.eval()
    before = len(spmm_calls)
    with torch.no_grad():
        assert rel_err(ours(x, ei), stock(x, ei)) < TOL
    assert len(spmm_calls) == before


def test_sparse_adj_t_inputs_are_keyed_by_the_tensor(spmm_calls):
    """A torch.sparse adj_t gives a new values() tensor on every read: the key is the sparse
    tensor itself, whose version counter also counts writes through values()."""
    from torch_geometric.utils import to_torch_csr_tensor

    ei, n = graph()
    adj_t = to_torch_csr_tensor(ei.flip(0), torch.rand(ei.shape[1]), (n, n))
    stock, ours = pair("gcn-wide-in")
    x = torch.randn(n, 16)
    for _ in range(3):
        ours(x, adj_t)
    assert input_cache.of(ours).holds
    before = len(spmm_calls)
    ours(x, adj_t)
    assert len(spmm_calls) == before
    adj_t.values().mul_(3)
    assert rel_err(ours(x, adj_t), stock(x, adj_t)) < TOL
