"""The extension build: loaded kernels, one schema for both paths, and the fallback when a build fails."""
import os
import subprocess
import sys
import textwrap

import torch

import fgplugin
from fgplugin import ops

# A small spmm + backward, checked against the dense reference, run in a fresh interpreter.
_CHECK = textwrap.dedent("""
    import warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import fgplugin
        import fgplugin._extension as ext
        ext.load()  # a second call must not warn again
    import torch
    from fgplugin.testing import dense_spmm, graph_cases, rel_error
    case = [c for c in graph_cases() if c.name == "not_divisible_weighted"][0]
    adj = case.adjacency()
    x = torch.randn(70, 5, requires_grad=True)
    out = fgplugin.spmm(adj, x, *adj.norm("gcn"))
    out.sum().backward()
    assert rel_error(out, dense_spmm(case.dense(), x.detach(), *adj.norm("gcn"))) <= 1e-5
    build_warnings = [w for w in caught if issubclass(w.category, ext.ExtensionBuildWarning)]
    print("STATUS", fgplugin.extension_status().loaded, len(build_warnings))
    for w in build_warnings:
        print("WARNING", w.message)
""")


def _run_check(**env):
    result = subprocess.run([sys.executable, "-c", _CHECK], env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_compiled_kernels_are_loaded():
    status = fgplugin.extension_status()
    if fgplugin.config.settings.build_extension:
        assert status.loaded, f"the C++ extension did not build: {status.reason}"
    assert torch.ops.fgplugin.spmm.default is not None


def test_the_status_is_plain_data():
    """extension_status() copies and pickles like the dataclass it is (the loaded module is kept
    apart from it)."""
    import copy
    import dataclasses
    import pickle

    status = fgplugin.extension_status()
    assert dataclasses.asdict(copy.deepcopy(status)) == dataclasses.asdict(pickle.loads(pickle.dumps(status)))


def test_python_schemas_match_the_compiled_ones():
    """The reference path (no extension) defines every op with the schema csrc/ gives it."""
    for name, schema in ops.SCHEMAS.items():
        assert str(getattr(torch.ops.fgplugin, name).default._schema) == "fgplugin::" + schema, name


def test_reference_path_when_extension_disabled():
    out = _run_check(FGPLUGIN_NO_EXTENSION="1")
    assert "STATUS False 0" in out  # asked for: no warning


def test_failed_build_warns_once_and_falls_back(tmp_path):
    out = _run_check(FGPLUGIN_CACHE_DIR=str(tmp_path), CXX="/bin/false", CC="/bin/false")
    assert "STATUS False 1" in out, out
    assert "FGPLUGIN_VERBOSE_BUILD" in out and "reference" in out


def test_default_arch_list_builds_sm90a_only_where_nvcc_can():
    """sm_90a (the wgmma dense-tile kernel) needs nvcc 12+; older toolkits keep plain 9.0, whose
    Hopper code runs the mma.sync kernel, instead of failing the whole build."""
    from fgplugin._extension import default_cuda_archs

    assert default_cuda_archs("12.0") == "8.0;9.0a"
    assert default_cuda_archs("13.0") == "8.0;9.0a"
    assert default_cuda_archs("11.8") == "8.0;9.0"
    assert default_cuda_archs(None) == "8.0;9.0"


_CUDA_FAILURE = ("Error building extension 'fgplugin_ops_cuda_0': [1/3] c++ -c args.cpp -o args.o\n"
                 "FAILED: block_adaptive_plan.o\n"
                 "/src/csrc/cuda/block_adaptive_spmm.cuh:46:10: fatal error: cuda_runtime_api.h: No such file or directory\n"
                 "compilation terminated.\nninja: build stopped: subcommand failed.\n")


def test_failed_cuda_build_keeps_the_cpu_kernels_and_is_noted(monkeypatch, tmp_path):
    """A CUDA build that fails (here: a toolkit whose headers are not under the CUDA_HOME torch
    guessed) still gives the CPU kernels and says why, with the compiler's error line; the failure
    is noted, so the next process goes straight to the CPU build, until the toolkit, the
    architectures or the note change."""
    import types

    import pytest

    import fgplugin._extension as ext

    monkeypatch.setattr(ext.config, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(ext, "cuda_build_plan", lambda: (True, ""))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(ext, "kept_spmm", ext.kept_spmm)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    builds = []

    def build(with_cuda):
        builds.append("cuda" if with_cuda else "cpu")
        if with_cuda:
            raise RuntimeError(_CUDA_FAILURE)
        return str(tmp_path / "cpu"), types.SimpleNamespace(KeptSpmm=ext.kept_spmm)

    monkeypatch.setattr(ext, "_build_and_load", build)

    def load_afresh():
        builds.clear()
        monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
        with pytest.warns(ext.ExtensionBuildWarning, match="CUDA kernels not built") as caught:
            status = ext.load()
        assert len(caught) == 1
        return status

    status = load_afresh()
    assert builds == ["cuda", "cpu"]
    assert status.loaded and not status.cuda and status.build_dir == str(tmp_path / "cpu")
    assert "fatal error: cuda_runtime_api.h: No such file or directory" in status.reason
    assert "CUDA_HOME" in status.reason and "cuda-build-failed.txt" in status.reason
    note = ext._build_dir(True) / "cuda-build-failed.txt"
    assert note.is_file() and not list(note.parent.glob("*.tmp"))

    status = load_afresh()  # a later process, same toolkit: no second try
    assert builds == ["cpu"] and "cuda_runtime_api.h" in status.reason

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # other architectures: tried again
    load_afresh()
    assert builds == ["cuda", "cpu"]
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    load_afresh()
    assert builds == ["cuda", "cpu"]  # the note is now for "9.0"

    note.unlink()  # the fix the message names: tried again
    load_afresh()
    assert builds == ["cuda", "cpu"]

    # a build that succeeds (here: for other architectures) removes the note of the failed one
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    monkeypatch.setattr(ext, "_build_and_load", lambda with_cuda: (str(tmp_path / "cuda"), types.SimpleNamespace(
        KeptSpmm=ext.kept_spmm)))
    monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
    status = ext.load()
    assert status.loaded and status.cuda and not status.reason and not note.exists()


def test_failed_cpu_build_after_a_failed_cuda_build_runs_the_reference_path(monkeypatch, tmp_path):
    import pytest

    import fgplugin._extension as ext

    monkeypatch.setattr(ext.config, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(ext, "cuda_build_plan", lambda: (True, ""))
    monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
    monkeypatch.setattr(ext, "kept_spmm", ext.kept_spmm)

    def build(with_cuda):
        raise RuntimeError(_CUDA_FAILURE if with_cuda else "Error building extension 'x'\nFAILED: args.o\n"
                           "args.cpp:1:10: fatal error: torch/extension.h: No such file or directory\n"
                           "ninja: build stopped: subcommand failed.")

    monkeypatch.setattr(ext, "_build_and_load", build)
    with pytest.warns(ext.ExtensionBuildWarning, match="reference kernels"):
        status = ext.load()
    assert not status.loaded and "torch/extension.h" in status.reason


def test_a_noted_cuda_failure_is_tried_again_when_the_toolkit_link_moves(monkeypatch, tmp_path):
    """/usr/local/cuda is often a link that a toolkit upgrade points elsewhere: the note is for
    where it led."""
    import fgplugin._extension as ext
    from torch.utils import cpp_extension

    for version in ("12.8", "13.0"):
        (tmp_path / f"cuda-{version}").mkdir()
    link = tmp_path / "cuda"
    link.symlink_to(tmp_path / "cuda-12.8")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(link))
    monkeypatch.setattr(ext.config, "cache_dir", lambda: tmp_path / "cache")
    ext._note_cuda_failure("RuntimeError: nvcc fatal: Unsupported gpu architecture")
    assert ext._noted_cuda_failure() == "RuntimeError: nvcc fatal: Unsupported gpu architecture"
    link.unlink()
    link.symlink_to(tmp_path / "cuda-13.0")
    assert ext._noted_cuda_failure() is None
