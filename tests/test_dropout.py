"""fgplugin.dropout / fgplugin.Dropout: torch's dropout contract with a parallel Philox mask on CPU.

The kernel is checked bit for bit against a NumPy Philox4x32-10 (itself checked against the
Random123 known-answer vectors), then for what users rely on: the keep rate, the scale, the
gradient, reproducibility under torch.manual_seed, independence from the thread count, and the
edge cases torch's dropout defines.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter

import fgplugin
from fgplugin import _extension, parallel_dropout

pytestmark = pytest.mark.skipif(not _extension.status.loaded,
                                reason="fgplugin's C++ extension did not build here; dropout falls back to torch's")

CHUNK = 4096  # csrc/cpu/dropout_cpu.cpp: elements per Philox subsequence


def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 (Salmon et al., SC'11) of counters ``[n, 4]`` under keys ``[n, 2]``, uint32."""
    x = counter.astype(np.uint64)
    k0, k1 = key[:, 0].astype(np.uint64), key[:, 1].astype(np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * x[:, 0]
        p1 = np.uint64(0xCD9E8D57) * x[:, 2]
        x = np.stack([(p1 >> np.uint64(32)) ^ x[:, 1] ^ k0, p1 & mask,
                      (p0 >> np.uint64(32)) ^ x[:, 3] ^ k1, p0 & mask], axis=1)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return x.astype(np.uint32)


def reference_keep(numel: int, p: float, seed: int) -> np.ndarray:
    """The kernel's documented mask: element i keeps iff word i % CHUNK of the Philox stream
    (key = seed, subsequence = i // CHUNK) is below round((1 - p) * 2^32)."""
    i = np.arange(numel, dtype=np.uint64)
    block, chunk = (i % CHUNK) // 4, i // CHUNK
    seed_u = np.uint64(seed % 2**64)
    counter = np.stack([block, np.zeros_like(block), chunk & np.uint64(0xFFFFFFFF), chunk >> np.uint64(32)], axis=1)
    key = np.tile(np.array([seed_u & np.uint64(0xFFFFFFFF), seed_u >> np.uint64(32)], dtype=np.uint64), (numel, 1))
    words = philox4x32_10(counter, key)[np.arange(numel), (i % np.uint64(4)).astype(np.int64)]
    return words.astype(np.uint64) < np.uint64(round((1.0 - p) * 2**32))


def test_reference_philox_matches_random123_known_answers():
    zeros = philox4x32_10(np.zeros((1, 4), np.uint32), np.zeros((1, 2), np.uint32))[0]
    assert [hex(w) for w in zeros] == ["0x6627e8d5", "0xe169c58d", "0xbc57ac4c", "0x9b00dbd8"]
    ones = philox4x32_10(np.full((1, 4), 0xFFFFFFFF, np.uint32), np.full((1, 2), 0xFFFFFFFF, np.uint32))[0]
    assert [hex(w) for w in ones] == ["0x408f276d", "0x41c83b0e", "0xa20bc7c6", "0x6d5451fd"]


@pytest.mark.parametrize("numel, p, seed", [(3 * CHUNK + 37, 0.3, 12345), (100, 0.5, 0), (CHUNK, 0.9, 2**62 + 7)])
def test_mask_is_the_documented_philox_stream(numel, p, seed):
    x = torch.rand(numel, dtype=torch.float64) + 1.0  # no zeros: out != 0 is the mask
    out = torch.ops.fgplugin.dropout(x, p, seed)
    expected = torch.from_numpy(reference_keep(numel, p, seed))
    assert torch.equal(out != 0, expected)
    assert torch.equal(out[expected], x[expected] * (1.0 / (1.0 - p)))


def test_keep_rate_scale_and_independence():
    x = torch.rand(1000, 1000) + 0.5
    for p in (0.1, 0.5, 0.9):
        out = fgplugin.dropout(x, p)
        keep = out != 0
        n = keep.numel()
        assert abs(keep.sum().item() - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p)), p
        torch.testing.assert_close(out[keep], x[keep] * (1 / (1 - p)), rtol=1e-6, atol=0)
        # Neighbours (within a 4-word block, across blocks and rows) are uncorrelated.
        k = keep.double() - (1 - p)
        for a, b in ((k[:, :-1], k[:, 1:]), (k[:, :-4], k[:, 4:]), (k[:-1], k[1:])):
            corr = (a * b).mean() / (p * (1 - p))
            assert abs(corr) < 5 / math.sqrt(a.numel()), (p, corr)
    assert not torch.equal(fgplugin.dropout(x, 0.5) != 0, fgplugin.dropout(x, 0.5) != 0)  # a new mask per call


def test_reproducible_under_manual_seed_and_any_thread_count():
    x = torch.randn(37, CHUNK // 8 + 3)
    threads = torch.get_num_threads()
    try:
        results = []
        for n_threads in (1, max(2, threads)):
            torch.set_num_threads(n_threads)
            torch.manual_seed(7)
            results.append(fgplugin.dropout(x, 0.4))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_gradient_is_the_same_mask_and_scale():
    x = torch.randn(50, 30, dtype=torch.float64, requires_grad=True)
    out = fgplugin.dropout(x, 0.25)
    grad = torch.randn_like(out)
    out.backward(grad)
    keep = (out != 0).double()
    torch.testing.assert_close(x.grad, grad * keep / 0.75, rtol=1e-15, atol=0)
    seed = 99  # the op with a fixed seed is a deterministic function: gradcheck and gradgradcheck apply
    op = lambda t: torch.ops.fgplugin.dropout(t, 0.25, seed)  # noqa: E731
    assert torch.autograd.gradcheck(op, (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),))
    assert torch.autograd.gradgradcheck(op, (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),))


def test_opcheck():
    torch.library.opcheck(torch.ops.fgplugin.dropout, (torch.randn(9, 4, requires_grad=True), 0.5, 3))
    torch.library.opcheck(torch.ops.fgplugin.dropout, (torch.randn(2, 3, 4, dtype=torch.float64), 0.1, -5))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_other_dtypes(dtype):
    x = torch.rand(300, 300, dtype=dtype) + 1
    out = fgplugin.dropout(x, 0.5)
    keep = out != 0
    assert out.dtype == dtype and abs(keep.float().mean().item() - 0.5) < 0.01
    math_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # at::opmath_type
    assert torch.equal(out[keep], (x[keep].to(math_dtype) * 2).to(dtype))


def test_torch_edge_cases():
    x = torch.randn(8, 8)
    assert fgplugin.dropout(x, 0.0) is x and fgplugin.dropout(x, 0.5, training=False) is x
    assert fgplugin.dropout(torch.empty(0, 3), 0.5).shape == (0, 3)
    assert torch.equal(fgplugin.dropout(x, 1.0), torch.zeros_like(x))
    nan = torch.full((64,), float("nan"))
    assert fgplugin.dropout(nan, 0.5).isnan().all() and fgplugin.dropout(nan, 1.0).isnan().all()  # 0 * NaN
    for p in (-0.1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1"):
            fgplugin.dropout(x, p)
    with pytest.raises(RuntimeError):  # torch's own error for integer input
        fgplugin.dropout(torch.arange(4), 0.5)
    with pytest.raises(RuntimeError, match=r"p must be in \[0, 1\]"):
        torch.ops.fgplugin.dropout(x, 2.0, 0)


def test_non_contiguous_and_inplace():
    base = torch.rand(40, 30) + 1
    xt = base.t()
    out = fgplugin.dropout(xt, 0.5)
    keep = out != 0
    assert out.shape == xt.shape and torch.equal(out[keep], xt[keep] * 2)
    y = base.clone()
    torch.manual_seed(3)
    expected = fgplugin.dropout(y, 0.3)
    torch.manual_seed(3)
    assert fgplugin.dropout(y, 0.3, inplace=True) is y and torch.equal(y, expected)


def test_module_is_torch_dropout_with_our_forward():
    module = fgplugin.Dropout(0.5)
    assert isinstance(module, torch.nn.Dropout) and repr(module) == "Dropout(p=0.5, inplace=False)"
    x = torch.rand(64, 64) + 1
    torch.manual_seed(1)
    expected = fgplugin.dropout(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(module(x), expected)
    assert module.eval()(x) is x


def test_falls_back_to_torch_without_the_extension(monkeypatch):
    x = torch.randn(32, 32)
    torch.manual_seed(5)
    expected = F.dropout(x, 0.5)
    monkeypatch.setattr(_extension.status, "loaded", False)
    torch.manual_seed(5)
    assert torch.equal(fgplugin.dropout(x, 0.5), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_uses_torch_dropout():
    x = torch.randn(256, 64, device="cuda")
    torch.manual_seed(5)
    expected = F.dropout(x, 0.5)
    torch.manual_seed(5)
    assert torch.equal(fgplugin.dropout(x, 0.5), expected)
    module = fgplugin.Dropout(0.5)  # its forward takes torch's dropout at once on CUDA
    torch.manual_seed(5)
    assert torch.equal(module(x), expected) and torch.equal(module.eval()(x), x)
    torch.manual_seed(5)
    expected = F.dropout(x.clone(), 0.5, inplace=True)  # torch's in-place dropout draws its own mask
    y = x.clone()
    torch.manual_seed(5)
    fgplugin.Dropout(0.5, inplace=True)(y)
    assert torch.equal(y, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_module_skips_the_functionals_checks(monkeypatch):
    # the module's CUDA route is the host time it saves: it must not go through dropout() first
    def refuse(*args, **kwargs):
        raise AssertionError("fgplugin.dropout() called for a CUDA tensor")

    monkeypatch.setattr(parallel_dropout, "dropout", refuse)
    x = torch.randn(64, 16, device="cuda")
    assert 0.3 < _drop_rate(fgplugin.Dropout(0.5)(x)) < 0.7
    with pytest.raises(AssertionError):  # the CPU route still calls it
        fgplugin.Dropout(0.5)(x.cpu())


def _drop_rate(y: torch.Tensor) -> float:
    return (y == 0).float().mean().item()


def test_compiled_scripted_traced_and_exported_models_run_a_real_dropout():
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), fgplugin.Dropout(0.5))
    x = torch.randn(256, 32)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    for _ in range(10):  # more calls than dynamo's recompile limit (8)
        y = compiled(x)
    assert counter.frame_count == 1 and 0.4 < _drop_rate(y) < 0.6  # one graph: no recompile per seed
    assert 0.4 < _drop_rate(torch.compile(model, fullgraph=True)(x)) < 0.6
    assert 0.4 < _drop_rate(torch.jit.script(model)(x)) < 0.6
    traced = torch.fx.symbolic_trace(model)  # dropout() is one node; the traced training flag stays
    assert any(node.op == "call_function" and "dropout" in str(node.target) for node in traced.graph.nodes)
    assert 0.4 < _drop_rate(traced(x)) < 0.6
    exported = torch.export.export(model, (x,)).module()
    assert 0.4 < _drop_rate(exported(x)) < 0.6
    torch._dynamo.reset()


def test_torch_func_and_forward_ad_get_torch_dropout():
    x, tangent = torch.randn(20, 5), torch.randn(20, 5)
    results = []
    for fn in (lambda v: fgplugin.dropout(v, 0.5), lambda v: F.dropout(v, 0.5)):
        torch.manual_seed(0)
        out, out_tangent = torch.func.jvp(fn, (x,), (tangent,))
        torch.manual_seed(0)
        grad = torch.func.grad(lambda v: fn(v).sum())(x)
        torch.manual_seed(0)
        jac = torch.func.jacrev(fn)(x[:3])
        with torch.autograd.forward_ad.dual_level():
            torch.manual_seed(0)
            dual_tangent = torch.autograd.forward_ad.unpack_dual(fn(torch.autograd.forward_ad.make_dual(x, tangent))).tangent
        results.append((out, out_tangent, grad, jac, dual_tangent))
    for ours, torchs in zip(*results):
        assert torch.equal(ours, torchs)
    assert results[0][1].count_nonzero() > 0  # a real tangent, not zeros


def test_seed_comes_from_the_cpu_generator_whatever_the_default_device():
    x = torch.rand(64, 64) + 1
    torch.manual_seed(11)
    expected = fgplugin.dropout(x, 0.5)
    with torch.device("meta"):
        torch.manual_seed(11)
        assert torch.equal(fgplugin.dropout(x, 0.5), expected)
