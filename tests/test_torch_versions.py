"""What the torch releases that fgplugin accepts (2.4 and later, pyproject.toml) need of the code,
checked under the torch CI installs (newer): private torch functions have a fallback, custom ops
keep their annotations as objects, PyG's EdgeIndex is read as its data, and where dynamo cannot
trace the layers they run eagerly inside a compiled model."""
import ast
from pathlib import Path

import pytest
import torch

from fgplugin.eager import _any_tensor_requires_grad, any_requires_grad

ROOT = Path(__file__).resolve().parent.parent


def _sources():
    for folder in ("fgplugin", "adapters"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_custom_op_modules_keep_annotations_as_objects():
    """torch 2.4's ``torch.library.custom_op`` infers the op's schema from annotation objects and
    refuses strings, which ``from __future__ import annotations`` makes of every annotation
    (importing fgplugin.pyg failed there)."""
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        future = any(isinstance(node, ast.ImportFrom) and node.module == "__future__"
                     and any(alias.name == "annotations" for alias in node.names) for node in tree.body)
        defines_op = any(isinstance(node, ast.Attribute) and node.attr == "custom_op" for node in ast.walk(tree))
        if future and defines_op:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"remove `from __future__ import annotations` from {offenders}: they define custom ops"


@pytest.mark.parametrize("grad", [False, True])
def test_any_requires_grad_fallback_agrees_with_torch(grad):
    """torch 2.7 and older have no ``torch._C._any_requires_grad``; the products' check then runs the
    Python fallback, which must answer as torch does for the arguments they pass (tensors, None,
    ints, lists of ints)."""
    if not hasattr(torch._C, "_any_requires_grad"):
        pytest.skip("this torch has no C++ check to compare with; the fallback is what runs")
    t = torch.ones(3, requires_grad=grad)
    cases = [(), (None,), (torch.ones(2), None, 3, [1, 2]), (torch.ones(2), t), (t, None, [0, 4], -1), (1.5, t)]
    for args in cases:
        assert _any_tensor_requires_grad(*args) == torch._C._any_requires_grad(*args), args
    assert any_requires_grad is torch._C._any_requires_grad


def test_an_edge_index_subclass_gives_its_data_without_a_copy():
    """PyG's ``EdgeIndex`` keeps its data in a tensor of its own: torch 2.4-2.9 refuse
    ``as_subclass(torch.Tensor)`` on it (every PyG layer given one ran the stock code), and 2.13
    gives the EdgeIndex back."""
    from fgplugin.validation import plain_tensor

    EdgeIndex = pytest.importorskip("torch_geometric", reason="PyG is an optional dependency").EdgeIndex
    data = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    plain = plain_tensor(EdgeIndex(data, sparse_size=(3, 3)))
    assert type(plain) is torch.Tensor and plain.data_ptr() == data.data_ptr() and torch.equal(plain, data)
    assert plain_tensor(data) is data


def test_where_dynamo_traces_fgplugin_the_layers_are_left_as_they_are(monkeypatch):
    from fgplugin import eager

    monkeypatch.setattr(eager, "DYNAMO_TRACES_FGPLUGIN", True)

    def forward(x):
        return x

    assert eager.eager_in_old_dynamo(forward) is forward


def test_a_layer_dynamo_cannot_trace_runs_eagerly_inside_a_compiled_model(monkeypatch):
    """Before torch 2.11 fgplugin's layers run eagerly behind a graph break inside a compiled model
    (tracing them failed inside dynamo): the same outputs and gradients as eager, the layer's own
    code not traced. Forced here on the torch CI runs."""
    from torch._dynamo.testing import CompileCounter

    from fgplugin import eager
    from fgplugin.testing import graph_cases

    fp = pytest.importorskip("fgplugin.pyg", reason="PyG is an optional dependency")
    monkeypatch.setattr(eager, "DYNAMO_TRACES_FGPLUGIN", False)
    traced = []
    forward = fp.GCNConv.forward

    def recording_forward(self, *args, **kwargs):
        traced.append(torch.compiler.is_compiling())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(fp.GCNConv, "forward", eager.eager_in_old_dynamo(recording_forward))
    torch._dynamo.reset()
    case = next(c for c in graph_cases() if c.name == "duplicate_edges")
    conv1, conv2 = fp.GCNConv(8, 16), fp.GCNConv(16, 4)
    model = lambda x: conv2((conv1(x, case.edge_index) * 2).relu(), case.edge_index)  # noqa: E731
    x = torch.randn(case.num_nodes, 8, requires_grad=True)
    expected = model(x)
    x_c = x.detach().requires_grad_()
    counter = CompileCounter()
    out = torch.compile(model, backend=counter)(x_c)
    assert traced and not any(traced) and counter.frame_count >= 1  # the model around the layers compiled
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(out)
    assert torch.allclose(torch.autograd.grad(out, x_c, grad)[0], torch.autograd.grad(expected, x, grad)[0],
                          rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_every_layer_forward_runs_eagerly_where_dynamo_cannot_trace_it():
    """The decorator is the identity on the torch CI runs, so only the source tells that every
    drop-in layer's ``forward`` carries it."""
    missing = []
    for path in [*sorted((ROOT / "adapters" / "pyg").glob("*_conv.py")), ROOT / "adapters" / "dgl" / "convs.py"]:
        for cls in (node for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "forward" and not any(
                        isinstance(d, ast.Name) and d.id == "eager_in_old_dynamo" for d in fn.decorator_list):
                    missing.append(f"{path.relative_to(ROOT)}:{cls.name}")
    assert not missing, f"decorate these forwards with fgplugin.eager.eager_in_old_dynamo: {missing}"
