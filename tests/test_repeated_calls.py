"""fgplugin.repeated_calls: a repeated fgplugin.spmm call reuses its decided call, and anything that
would change a decision (or the result) takes the full path again; results against float64."""
import dataclasses

import pytest
import torch

import fgplugin
from fgplugin import _extension, ops, repeated_calls
from fgplugin.config import settings
from fgplugin.testing import dense_spmm, graph_cases, random_graph_case, rel_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _case(device, weighted=False, seed=3):
    """A graph case (weighted: edge weights in [0.5, 1.5)) and its adjacency on ``device``."""
    case = random_graph_case(seed, n_src=40)
    if weighted:
        case = dataclasses.replace(case, edge_weight=torch.rand(case.edge_index.shape[1]) + 0.5)
    return case, case.adjacency().to(device)


def _reference(dense, x, r, c, d, bias=None, width=None):
    cpu = lambda t: None if t is None else t.detach().cpu().double()  # noqa: E731
    out = dense_spmm(dense, cpu(x), cpu(r), cpu(c), cpu(d))
    out = out if width is None else out[:, :width]
    return out if bias is None else out + cpu(bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", [False, True])
def test_a_repeated_call_reuses_its_decisions_and_matches_float64(device, grad):
    case, adj = _case(device)
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    bias = torch.randn(5, device=device, requires_grad=grad)
    for step in range(3):
        x = torch.randn(adj.shape[1], 7, device=device, requires_grad=grad)
        found = repeated_calls.find(adj, x, r, c, d, bias, 5)
        assert (found is None) == (step == 0)  # the first call decides, the others reuse
        out = fgplugin.spmm(adj, x, r, c, d, bias=bias, width=5)
        assert out.shape == (adj.shape[0], 5) and rel_error(out, _reference(case.dense(), x, r, c, d, bias, 5)) <= 1e-5
        assert out.requires_grad == grad
        if grad:
            g = torch.randn_like(out)
            out.backward(g)
            ref_x = dense_spmm(case.dense().t(), g.cpu().double(), c.cpu(), r.cpu(), d.cpu())
            assert rel_error(x.grad[:, :5], ref_x) <= 1e-5 and x.grad[:, 5:].abs().max() == 0
            assert rel_error(bias.grad, g.sum(0)) <= 1e-5
            bias.grad = None
    assert len(adj._calls) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_write_to_the_edge_values_is_seen(device):
    case, adj = _case(device, weighted=True)
    x = torch.randn(adj.shape[1], 4, device=device)
    for _ in range(2):
        fgplugin.spmm(adj, x)
    with torch.no_grad():
        adj.values.mul_(3.0)
    assert repeated_calls.find(adj, x, None, None, None, None, None) is None  # its version moved
    assert rel_error(fgplugin.spmm(adj, x), _reference(3.0 * case.dense(), x, None, None, None)) <= 1e-5
    assert len(adj._calls) == 1  # the call kept for the old values is gone (it held their cast)


def test_scales_or_values_that_need_a_gradient_get_it():
    """A kept call's scale later asked for a gradient, or its edge values, takes the full path:
    the gradient arrives and matches float64."""
    case, adj = _case("cpu", weighted=True)
    r, c, d = (t.clone() for t in adj.norm("gcn", dtype=torch.float32))
    x = torch.randn(adj.shape[1], 3, requires_grad=True)
    for _ in range(2):
        fgplugin.spmm(adj, x, r, c, d)
    r.requires_grad_()
    out = fgplugin.spmm(adj, x, r, c, d)
    g = torch.randn_like(out)
    out.backward(g)
    u = dense_spmm(case.dense(), x.detach().double(), None, c, d)  # the product before the row scale
    assert r.grad is not None and rel_error(r.grad, (g.double() * u).sum(1)) <= 1e-5
    r.requires_grad_(False)
    adj.values.requires_grad_()
    out = fgplugin.spmm(adj, x, r, c, d)
    out.backward(g)
    assert adj.values.grad is not None and adj.values.grad.abs().sum() > 0


@pytest.mark.skipif(not _extension.status.loaded, reason="KeptSpmm is the compiled extension's (no extension here)")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_grad", [None, False, True])
def test_a_kept_call_runs_in_cpp_where_it_can(device, bias_grad):
    """A repeated call that runs below autograd or needs x's gradient (and the bias's) is the
    extension's KeptSpmm; its result and gradients (x, bias) match float64; a float diagonal keeps the Python
    form (it is made into a vector per call)."""
    case, adj = _case(device)
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    bias = None if bias_grad is None else torch.randn(5, device=device, requires_grad=bias_grad)
    for grad in (False, True):
        x = torch.randn(adj.shape[1], 7, device=device, requires_grad=grad)
        fgplugin.spmm(adj, x, r, c, d, bias=bias, width=5)
        found = repeated_calls.find(adj, x, r, c, d, bias, 5)
        if bias_grad and not grad:  # a gradient for the bias alone: the Python node's (not x's alone)
            assert isinstance(found, ops.PreparedCall)
        else:
            assert type(found) is _extension.kept_spmm and found.wrt_x == grad and found.width == 5
        out = fgplugin.spmm(adj, x, r, c, d, bias=bias, width=5)
        assert rel_error(out, _reference(case.dense(), x, r, c, d, bias, 5)) <= 1e-5
        assert out.requires_grad == (grad or bool(bias_grad))
        if grad:
            g = torch.randn_like(out)
            out.backward(g)
            ref_x = dense_spmm(case.dense().t(), g.cpu().double(), c.cpu(), r.cpu(), d.cpu())
            assert rel_error(x.grad[:, :5], ref_x) <= 1e-5 and x.grad[:, 5:].abs().max() == 0
            if bias_grad:
                assert rel_error(bias.grad, g.sum(0)) <= 1e-5
    x = torch.randn(adj.shape[1], 3, device=device)
    fgplugin.spmm(adj, x, diag=1.5)
    assert isinstance(repeated_calls.find(adj, x, None, None, 1.5, None, None), ops.PreparedCall)


@pytest.mark.parametrize("device", DEVICES)
def test_a_scale_written_before_the_backward_is_an_error(device):
    """The node of a kept call saves the scales as autograd does: a write to one between the
    forward and the backward is refused, not read."""
    _, adj = _case(device)
    r, c, d = (t.clone() for t in adj.norm("gcn", dtype=torch.float32))
    x = torch.randn(adj.shape[1], 4, device=device, requires_grad=True)
    for _ in range(2):  # the second call is a kept one
        out = fgplugin.spmm(adj, x, r, c, d)
    with torch.no_grad():
        r.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_switches_and_grad_mode_are_part_of_the_key(monkeypatch):
    _, adj = _case("cpu")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    x = torch.randn(adj.shape[1], 6, requires_grad=True)
    fgplugin.spmm(adj, x, r, c, d)
    with torch.no_grad():
        assert repeated_calls.find(adj, x, r, c, d, None, None) is None
        out = fgplugin.spmm(adj, x, r, c, d)
    assert out.grad_fn is None
    monkeypatch.setattr(settings, "block_adaptive", not settings.block_adaptive)
    assert repeated_calls.find(adj, x, r, c, d, None, None) is None
    assert fgplugin.spmm(adj, x, r, c, d).grad_fn is not None


def test_a_float_diagonal_is_keyed_by_its_value():
    case, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 3)
    for value in (1.0, 1.0, 2.5, 2.5, 1.0):
        out = fgplugin.spmm(adj, x, diag=value)
        ref = _reference(case.dense(), x, None, None, torch.full((adj.shape[0],), value))
        assert rel_error(out, ref) <= 1e-5


def test_contexts_that_need_the_dispatcher_take_the_full_path():
    """Under a dispatch mode and autocast nothing kept is used, and calls made there keep nothing."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "fgplugin" in str(func):
                Count.ops += 1
            return func(*args, **(kwargs or {}))

    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    fgplugin.spmm(adj, x)
    kept = dict(adj._calls)
    with Count():
        fgplugin.spmm(adj, x)
    assert Count.ops == 1  # the op went through the dispatcher, where the mode saw it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fgplugin.spmm(adj, x).dtype == torch.bfloat16
    assert adj._calls == kept


def test_the_kept_calls_are_bounded():
    _, adj = _case("cpu")
    for width in range(1, repeated_calls.MAX_KEPT + 5):
        fgplugin.spmm(adj, torch.randn(adj.shape[1], width))
    assert 0 < len(adj._calls) <= repeated_calls.MAX_KEPT


def test_arguments_with_a_torch_function_keep_it():
    """A scale or bias of a tensor subclass with ``__torch_function__`` reaches it on every call,
    kept or not (the extension's C++ kept call would skip it), and the output keeps its type."""

    class Logged(torch.Tensor):
        calls = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            Logged.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    case, adj = _case("cpu")
    r, c, d = adj.norm("gcn", dtype=torch.float32)
    bias = torch.randn(4).as_subclass(Logged)
    x = torch.randn(adj.shape[1], 4)
    for _ in range(3):
        Logged.calls = 0
        out = fgplugin.spmm(adj, x, r.as_subclass(Logged), c, d, bias=bias)
        assert Logged.calls > 0 and type(out) is Logged
        ref = _reference(case.dense(), x, r, c, d, bias.as_subclass(torch.Tensor))
        assert rel_error(out.as_subclass(torch.Tensor), ref) <= 1e-5
    assert all(isinstance(kept, ops.PreparedCall) for kept, _ in adj._calls.values())


def test_the_reference_kernel_checks_the_lengths_a_repeated_call_passes():
    """Without the extension a repeated call's tensors reach the pure-torch kernel unchecked: a
    scale or bias of the wrong length is refused by name there, not broadcast."""
    from fgplugin.reference import spmm_reference

    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    for name, bad in (("row_scale", dict(row_scale=torch.ones(1))), ("col_scale", dict(col_scale=torch.ones(1))),
                      ("diag", dict(diag=torch.ones(1))), ("bias", dict(bias=torch.ones(1)))):
        kwargs = {"row_scale": None, "col_scale": None, "diag": None, **bad}
        with pytest.raises(RuntimeError, match=f"{name} must be a 1-D tensor with"):
            spmm_reference(adj.rowptr, adj.col, None, x, **kwargs)


def test_a_bias_resized_in_place_is_a_clear_error():
    """The op's own checks run on every call: a kept call's bias whose data was swapped for
    another shape is refused by name, not read out of bounds."""
    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    bias = torch.nn.Parameter(torch.zeros(4))
    for _ in range(2):
        fgplugin.spmm(adj, x, bias=bias)
    bias.data = torch.zeros(9)
    with pytest.raises(RuntimeError, match="bias"):
        fgplugin.spmm(adj, x, bias=bias)


@pytest.mark.parametrize("case", graph_cases(), ids=lambda c: c.name)
def test_repeated_calls_on_the_case_registry(case):
    adj = case.adjacency()
    r, c, d = (None, None, None) if not case.is_square else adj.norm("gcn")
    x = torch.randn(case.shape[1], 5, dtype=torch.float64)
    outs = [fgplugin.spmm(adj, x, r, c, d) for _ in range(3)]
    ref = dense_spmm(case.dense(), x, r, c, d)
    assert all(rel_error(out, ref) <= 1e-12 for out in outs)


def test_scales_made_anew_every_step_are_freed():
    """A kept call holds none of the caller's tensors: per-step scales and the vectors of float
    diagonals that change every step (GIN's 1 + eps) go as they would without it."""
    import gc
    import weakref

    _, adj = _case("cpu")
    deg = torch.rand(adj.shape[0]) + 1.0
    x = torch.randn(adj.shape[1], 3, requires_grad=True)
    refs = []
    for _ in range(6):
        dinv = deg.pow(-0.5)
        fgplugin.spmm(adj, x, dinv, dinv).sum().backward()
        refs.append(weakref.ref(dinv))
        del dinv
    first = adj.constant_diag(1.0, torch.float32)
    first_ref = weakref.ref(first)
    del first
    for step in range(12):
        fgplugin.spmm(adj, x, diag=1.0 + 0.01 * step).sum().backward()
    gc.collect()
    assert all(ref() is None for ref in refs) and first_ref() is None


def test_a_scale_whose_dtype_changed_is_cast_again():
    case, adj = _case("cpu")
    r, c, d = (t.clone() for t in adj.norm("gcn", dtype=torch.float32))
    x = torch.randn(adj.shape[1], 4)
    for _ in range(2):
        fgplugin.spmm(adj, x, r, c, d)
    r.data = (r.data * 2).double()
    assert rel_error(fgplugin.spmm(adj, x, r, c, d), _reference(case.dense(), x, r, c, d)) <= 1e-5


def test_kept_calls_do_not_recompile_a_compiled_caller():
    """torch.compile traces past the kept calls: calls kept later in eager mode (other widths) do
    not invalidate the compiled graph (a guard on them hit the recompile limit under fullgraph)."""
    case, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda a, t: fgplugin.spmm(a, t), fullgraph=True, backend=backend)
    for width in range(5, 16):
        fgplugin.spmm(adj, torch.randn(adj.shape[1], width))
        assert rel_error(f(adj, x), _reference(case.dense(), x, None, None, None)) <= 1e-5
    assert len(graphs) == 1


def test_forward_mode_ad_over_constants_still_works():
    """Only a tangent that reaches the product is refused: a product of constants inside
    torch.func.jvp is a constant."""
    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    w = torch.randn(4)
    out, tangent = torch.func.jvp(lambda v: fgplugin.spmm(adj, x) * v, (w,), (torch.ones(4),))
    assert torch.allclose(tangent, fgplugin.spmm(adj, x)) and torch.allclose(out, fgplugin.spmm(adj, x) * w)


@pytest.mark.parametrize("bad", [dict(row_scale=2.0), dict(row_scale=[1.0] * 40), dict(diag=[0.5] * 40),
                                 dict(bias=1.0), dict(diag=0.5 + 0j)], ids=str)
def test_bad_arguments_get_the_checks_error_once_calls_are_kept(bad):
    """An adjacency with kept calls (one with a float diagonal among them) still refuses bad scales,
    diagonals and biases with the full path's clear error."""
    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    for _ in range(2):
        fgplugin.spmm(adj, x)
        fgplugin.spmm(adj, x, diag=0.5)
    with pytest.raises((ValueError, TypeError), match="row_scale|diag|bias"):
        fgplugin.spmm(adj, x, **bad)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_x_gets_the_checks_error_once_a_dense_call_is_kept(layout):
    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    for _ in range(2):
        fgplugin.spmm(adj, x)
    sparse = x.to_sparse() if layout == "coo" else x.to_sparse_csr()
    with pytest.raises(ValueError, match="x must be a dense tensor"):
        fgplugin.spmm(adj, sparse)


def test_a_numpy_diagonal_is_refused_as_before():
    np = pytest.importorskip("numpy")
    _, adj = _case("cpu")
    x = torch.randn(adj.shape[1], 4)
    for _ in range(2):
        fgplugin.spmm(adj, x, diag=0.5)
    with pytest.raises(ValueError, match="diag"):
        fgplugin.spmm(adj, x, diag=np.float32(0.5))
