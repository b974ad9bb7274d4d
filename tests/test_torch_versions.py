"""What the oldest torch that fgplugin accepts (2.4, pyproject.toml) needs of the code, checked
under the torch CI installs (newer): private torch functions have a fallback, and custom ops keep
their annotations as objects."""
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
    """torch < 2.5 has no ``torch._C._any_requires_grad``; the products' check then runs the
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
    """PyG's ``EdgeIndex`` keeps its data in a tensor of its own; under torch 2.4
    ``as_subclass(torch.Tensor)`` refuses it, and every PyG layer given one ran the stock code."""
    from fgplugin.validation import plain_tensor

    EdgeIndex = pytest.importorskip("torch_geometric", reason="PyG is an optional dependency").EdgeIndex
    data = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    plain = plain_tensor(EdgeIndex(data, sparse_size=(3, 3)))
    assert type(plain) is torch.Tensor and plain.data_ptr() == data.data_ptr() and torch.equal(plain, data)
    assert plain_tensor(data) is data
