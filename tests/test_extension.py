"""The extension build: loaded kernels, one schema for both paths, and the fallback when a build fails."""
import contextlib
import os
import subprocess
import sys
import textwrap
import types

import pytest
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
                 "FAILED: [code=1] block_adaptive_plan.o\n"
                 "c++ -MMD -I/usr/local/include -c /src/error-handling/csrc/cuda/block_adaptive_plan.cpp -o block_adaptive_plan.o\n"
                 "/src/csrc/cuda/block_adaptive_spmm.cuh:46:10: fatal error: cuda_runtime_api.h: No such file or directory\n"
                 "compilation terminated.\nninja: build stopped: subcommand failed.\n")


class _FakeBuilds:
    """torch.utils.cpp_extension.load as the build sees it: each call noted as (flavour, module
    name); a CUDA build raises ``_CUDA_FAILURE`` unless told to succeed."""

    def __init__(self, ext, cuda_fails: bool = True):
        self.ext, self.cuda_fails, self.calls = ext, cuda_fails, []

    def __call__(self, *, name, with_cuda, **_):
        self.calls.append(("cuda" if with_cuda else "cpu", name))
        if with_cuda and self.cuda_fails:
            raise RuntimeError(_CUDA_FAILURE)
        return types.SimpleNamespace(KeptSpmm=self.ext.kept_spmm)

    @property
    def flavours(self):
        return [flavour for flavour, _ in self.calls]


def _planned_cuda_builds(monkeypatch, tmp_path):
    """fgplugin._extension set up to build into ``tmp_path`` as if torch were a CUDA build, with
    torch's compile step faked (_FakeBuilds)."""
    import fgplugin._extension as ext
    from torch.utils import cpp_extension

    monkeypatch.setattr(ext.config, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(ext, "cuda_build_plan", lambda: (True, ""))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(ext, "kept_spmm", ext.kept_spmm)
    monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    builds = _FakeBuilds(ext)
    monkeypatch.setattr(cpp_extension, "load", builds)
    return ext, builds


def test_failed_cuda_build_keeps_the_cpu_kernels_and_is_noted(monkeypatch, tmp_path):
    """A CUDA build that fails (here: a toolkit whose headers are not under the CUDA_HOME torch
    guessed) still gives the CPU kernels and says why, with the compiler's error line; the failure
    is noted, so the next process goes straight to the CPU build, until the toolkit, the
    architectures or the note change; a build that succeeds removes the note."""
    ext, builds = _planned_cuda_builds(monkeypatch, tmp_path)

    def load_afresh():
        builds.calls.clear()
        monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
        with pytest.warns(ext.ExtensionBuildWarning, match="CUDA kernels not built") as caught:
            status = ext.load()
        assert len(caught) == 1
        return status

    status = load_afresh()
    assert builds.flavours == ["cuda", "cpu"]
    # module names of their own: torch would rename a second build of one name in a process to
    # "<name>_v1", which the next process does not find (it would compile the CPU kernels again)
    (_, cuda_name), (_, cpu_name) = builds.calls
    assert cuda_name != cpu_name and status.build_dir.endswith(cpu_name.rsplit("_", 1)[-1])
    assert status.loaded and not status.cuda and "-cpu-" in status.build_dir
    assert "fatal error: cuda_runtime_api.h: No such file or directory" in status.reason
    note = ext._build_dir(True) / "cuda-build-failed.txt"
    assert "CUDA_HOME" in status.reason and str(note) in status.reason
    assert note.is_file() and not list(note.parent.glob("*.tmp"))

    status = load_afresh()  # a later process, same toolkit: no second try
    assert builds.flavours == ["cpu"] and "cuda_runtime_api.h" in status.reason

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # other architectures: tried again
    load_afresh()
    assert builds.flavours == ["cuda", "cpu"]
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    load_afresh()
    assert builds.flavours == ["cuda", "cpu"]  # the note is now for "9.0"

    note.unlink()  # the fix the message names: tried again
    load_afresh()
    assert builds.flavours == ["cuda", "cpu"]

    builds.cuda_fails = False  # a build that succeeds (for other architectures) removes the note
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    builds.calls.clear()
    monkeypatch.setattr(ext, "status", ext.ExtensionStatus())
    status = ext.load()
    assert builds.flavours == ["cuda"] and status.loaded and status.cuda and not status.reason
    assert not note.exists()


def test_a_process_that_waited_for_the_build_lock_reads_the_note(monkeypatch, tmp_path):
    """Processes that start together (one per rank) wait on one build lock: the first notes the
    failure, the others find the note under the lock and do not compile again."""
    ext, builds = _planned_cuda_builds(monkeypatch, tmp_path)
    note, key = ext._build_dir(True) / "cuda-build-failed.txt", ext._cuda_toolkit_key()
    real_lock = ext._exclusive

    @contextlib.contextmanager
    def lock_held_by_a_failed_build(path):
        with real_lock(path):
            if "-cu13.0-" in str(path):  # the other process noted its failure while this one waited
                ext._write_note(note, key, "RuntimeError: nvcc fatal   : Unsupported gpu architecture")
            yield

    monkeypatch.setattr(ext, "_exclusive", lock_held_by_a_failed_build)
    with pytest.warns(ext.ExtensionBuildWarning, match="Unsupported gpu architecture"):
        status = ext.load()
    assert builds.flavours == ["cpu"] and status.loaded and not status.cuda


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
    note = tmp_path / "cuda-build-failed.txt"
    ext._write_note(note, ext._cuda_toolkit_key(), "RuntimeError: nvcc fatal   : Unsupported gpu architecture")
    with pytest.raises(ext.NotedCudaFailure, match="Unsupported gpu architecture"):
        ext._raise_if_noted(note, ext._cuda_toolkit_key())
    link.unlink()
    link.symlink_to(tmp_path / "cuda-13.0")
    ext._raise_if_noted(note, ext._cuda_toolkit_key())  # another toolkit: nothing noted for it


def test_notes_are_utf8_whatever_the_locale(tmp_path):
    """gcc quotes names in ‘ ’: a note written and read under the C locale keeps them and raises
    nothing (a note that cannot be written is simply not written)."""
    script = textwrap.dedent(f"""
        from pathlib import Path
        import fgplugin._extension as ext
        note = Path({str(tmp_path)!r}) / "cuda-build-failed.txt"
        ext._write_note(note, "KEY\\n", "RuntimeError: a.cu:1:1: fatal error: \\u2018cuda.h\\u2019: No such file")
        ext._write_note(Path({str(tmp_path)!r}) / "missing" / "note.txt", "KEY\\n", "x")
        try:
            ext._raise_if_noted(note, "KEY\\n")
        except ext.NotedCudaFailure as noted:
            print(ascii(str(noted)))
    """)
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "\\u2018cuda.h\\u2019" in result.stdout
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("output, named", [
    (_CUDA_FAILURE, "/src/csrc/cuda/block_adaptive_spmm.cuh:46:10: fatal error: cuda_runtime_api.h: No such file or directory"),
    ("Error building extension 'x': [1/2] c++ -c a.cpp\nFAILED: a.o\nc++ -c /src/my-error-logs/a.cpp -o a.o\n"
     "/src/a.cpp:2:2: warning: #warning \"keep error codes in sync\" [-Wcpp]\n/src/a.cpp:5:7: error: 'x' was not declared\n"
     "ninja: build stopped: subcommand failed.", "/src/a.cpp:5:7: error: 'x' was not declared"),
    ("Error building extension 'x': FAILED: x.so\nc++ a.o -o x.so -lnonexistentlib\n"
     "/usr/bin/ld: cannot find -lnonexistentlib: No such file or directory\ncollect2: error: ld returned 1 exit status\n"
     "ninja: build stopped: subcommand failed.", "/usr/bin/ld: cannot find -lnonexistentlib: No such file or directory"),
    ("Error building extension 'x': FAILED: k.cuda.o\n/usr/local/cuda/bin/nvcc -c k.cu -o k.cuda.o\n"
     "nvcc fatal   : Unsupported gpu architecture 'compute_90a'\nninja: build stopped: subcommand failed.",
     "nvcc fatal   : Unsupported gpu architecture 'compute_90a'"),
    ("Error building extension 'x'\nninja: build stopped: interrupted by user.", "ninja: build stopped: interrupted by user."),
])
def test_the_compiler_error_quoted_is_the_one_that_failed_the_build(output, named):
    from fgplugin._extension import compiler_error

    assert compiler_error(RuntimeError(output)) == f"RuntimeError: {named}"


def test_load_never_raises_even_where_the_build_folder_cannot_be_named(monkeypatch, tmp_path):
    ext, _ = _planned_cuda_builds(monkeypatch, tmp_path)

    def unreadable_sources():
        raise PermissionError(13, "Permission denied", "csrc/args.cpp")

    monkeypatch.setattr(ext, "_sources_hash", unreadable_sources)
    with pytest.warns(ext.ExtensionBuildWarning, match="reference kernels"):
        status = ext.load()
    assert not status.loaded and "PermissionError" in status.reason


def test_failed_cpu_build_after_a_failed_cuda_build_runs_the_reference_path(monkeypatch, tmp_path):
    ext, builds = _planned_cuda_builds(monkeypatch, tmp_path)

    def both_fail(*, with_cuda, **_):
        raise RuntimeError(_CUDA_FAILURE if with_cuda else "Error building extension 'x'\nFAILED: args.o\n"
                           "c++ -c args.cpp\nargs.cpp:1:10: fatal error: torch/extension.h: No such file or directory\n"
                           "ninja: build stopped: subcommand failed.")

    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "load", both_fail)
    with pytest.warns(ext.ExtensionBuildWarning, match="reference kernels"):
        status = ext.load()
    assert not status.loaded and "torch/extension.h" in status.reason
