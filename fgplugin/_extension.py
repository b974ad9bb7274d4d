"""Builds the C++/CUDA extension against the installed torch on first import, and caches it.

Why at first use and not at install: building at install time needs torch inside pip's isolated
build environment, which makes pip download a second torch. Here the sources (shipped as
``fgplugin._csrc``) are compiled with ``torch.utils.cpp_extension.load`` into a cache folder keyed
by the torch version, the CUDA flavour and a hash of the sources, so an upgrade of either
rebuilds and a second import loads in well under a second.

CUDA kernels are compiled when torch is a CUDA build and a CUDA toolkit (nvcc) is found
(``CUDA_HOME``), whether or not a GPU is visible, so a GPU-less build host still produces them.
``TORCH_CUDA_ARCH_LIST`` picks the GPU architectures (default here: "8.0;9.0a", or "8.0;9.0"
with nvcc < 12; a list without "9.0a" builds no wgmma kernel, and Hopper GPUs then run the
mma.sync one); ``MAX_JOBS`` caps the compiler's parallelism.

If the CUDA part of the build fails (a toolkit without its headers, or one torch guessed wrongly
from an ``nvcc`` wrapper on PATH), fgplugin builds the CPU kernels alone and warns once with the
compiler's error and the fix; CUDA tensors then run on the pure-torch reference path. The failure
is noted in the build folder (``cuda-build-failed.txt``) with the toolkit and architectures it was
for, so later imports go straight to the CPU build until one of those changes or the note is
deleted. If the CPU build fails too, every op runs on the reference path (fgplugin/reference.py).

The switches that steer the build (FGPLUGIN_CACHE_DIR, FGPLUGIN_NO_EXTENSION, FGPLUGIN_NO_CUDA,
FGPLUGIN_VERBOSE_BUILD) are read in fgplugin/config.py.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import config
from .cache import write_atomically


def default_cuda_archs(nvcc_version: str | None) -> str:
    """The TORCH_CUDA_ARCH_LIST used when the user sets none. 9.0a, not 9.0: Hopper's warpgroup MMA
    (the dense-tile kernel of csrc/cuda/dense_tiles_sm90.cu) exists only in sm_90a code, which runs
    on compute capability 9.0 GPUs (H100, H200) alone; other GPUs of generation 8 and 9 run the
    sm_80 code. nvcc before 12.0 cannot build sm_90a, so it gets plain 9.0 (the mma.sync kernel)."""
    try:
        major = int((nvcc_version or "").split(".")[0])
    except ValueError:
        major = 0
    return "8.0;9.0a" if major >= 12 else "8.0;9.0"


class ExtensionBuildWarning(RuntimeWarning):
    """The C++/CUDA extension could not be built; fgplugin runs on its pure-torch reference path."""


@dataclass
class ExtensionStatus:
    loaded: bool = False  # the compiled kernels are registered
    cuda: bool = False  # ... including the CUDA kernels
    reason: str = ""  # why not (empty when everything built)
    build_dir: str | None = None


status = ExtensionStatus()
kept_spmm = None  # the extension's KeptSpmm class (csrc/kept_call.cpp) once loaded; not on status, which is plain data


def source_dir() -> Path:
    spec = importlib.util.find_spec("fgplugin._csrc")  # installed wheel or editable install
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "csrc"  # a plain source checkout


def _sources(with_cuda: bool) -> list[Path]:
    root = source_dir()
    files = [*sorted(root.glob("*.cpp")), *sorted((root / "cpu").glob("*.cpp"))]
    if with_cuda:
        files += sorted((root / "cuda").glob("*.cpp")) + sorted((root / "cuda").glob("*.cu"))
    return files


def _sources_hash() -> str:
    root = source_dir()
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in {".cpp", ".h", ".cu", ".cuh"}):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _nvcc_version(cuda_home: str) -> str | None:
    try:
        out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def cuda_build_plan() -> tuple[bool, str]:
    """(compile CUDA kernels?, why not). Decided from the torch build and nvcc, not from a GPU."""
    if not config.settings.build_cuda:
        return False, "FGPLUGIN_NO_CUDA=1 is set"
    if torch.version.cuda is None:
        return False, "the installed torch is a CPU-only build"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return False, (f"torch is built for CUDA {torch.version.cuda} but no CUDA toolkit (nvcc) was found; "
                       "install one and set CUDA_HOME to build the GPU kernels")
    nvcc = _nvcc_version(CUDA_HOME)
    if nvcc is None:
        return False, f"could not run {CUDA_HOME}/bin/nvcc --version; check CUDA_HOME"
    if nvcc.split(".")[0] != torch.version.cuda.split(".")[0]:
        return False, (f"nvcc {nvcc} (CUDA_HOME={CUDA_HOME}) does not match the CUDA {torch.version.cuda} that "
                       f"torch {torch.__version__} was built with; install a CUDA {torch.version.cuda.split('.')[0]}.x "
                       "toolkit and point CUDA_HOME at it, or install a torch build for your CUDA")
    return True, ""


def openmp_flags() -> list[str]:
    """``-fopenmp`` when torch's ATen uses OpenMP: at::parallel_for is a ``#pragma omp`` in the
    headers, so without the flag the CPU kernel silently runs on one thread."""
    return ["-fopenmp"] if "OpenMP" in torch.__config__.parallel_info() and sys.platform == "linux" else []


def _build_dir(with_cuda: bool) -> Path:
    """The cache folder of one build: torch version, CUDA or CPU flavour, Python, sources' hash."""
    flavour = f"cu{torch.version.cuda}" if with_cuda else "cpu"
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"torch{torch.__version__}-{flavour}-py{sys.version_info[0]}{sys.version_info[1]}")
    return config.cache_dir() / "ext" / f"{tag}-{_sources_hash()}"


def _build_and_load(with_cuda: bool) -> tuple[str, object]:
    """(the build folder, the loaded extension module).

    A CUDA build that failed before for the same toolkit and architectures raises
    :class:`NotedCudaFailure` without compiling; one that fails now is noted and raises it too, and
    one that succeeds removes the note. Both happen under the build's lock, so processes that start
    together (one per rank) try a failing build once."""
    from torch.utils import cpp_extension

    build_dir = _build_dir(with_cuda)
    build_dir.mkdir(parents=True, exist_ok=True)
    note, key = build_dir / _CUDA_FAILURE_NOTE, _cuda_toolkit_key() if with_cuda else ""
    if with_cuda:
        _raise_if_noted(note, key)  # the usual way: no wait on another process's build
    # a name of its own per flavour: torch renames a second build of one name in a process (the
    # CPU build after a failed CUDA one) to "<name>_v1", which the next process would not find
    name = f"fgplugin_ops_{'cuda' if with_cuda else 'cpu'}_{build_dir.name.rsplit('-', 1)[-1]}"
    saved_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if with_cuda and saved_arch is None:
        os.environ["TORCH_CUDA_ARCH_LIST"] = default_cuda_archs(
            _nvcc_version(cpp_extension.CUDA_HOME) if cpp_extension.CUDA_HOME else None)
    try:
        with _exclusive(build_dir / "fgplugin-build.lock"):
            if with_cuda:
                _raise_if_noted(note, key)  # noted by a process this one waited for
            if not (build_dir / f"{name}.so").exists():
                print(f"fgplugin: compiling the {'CPU+CUDA' if with_cuda else 'CPU'} kernels for torch "
                      f"{torch.__version__} into {build_dir} (once; about a minute)", file=sys.stderr, flush=True)
            # torch's own lock file of a build that was killed would make this wait forever: holding
            # ours, no other fgplugin process is building here, so any such file is stale.
            (build_dir / "lock").unlink(missing_ok=True)
            try:
                module = cpp_extension.load(
                    name=name,
                    sources=[str(p) for p in _sources(with_cuda)],
                    extra_cflags=["-O3", *openmp_flags()],
                    extra_ldflags=openmp_flags(),
                    extra_cuda_cflags=["-O3", "-lineinfo"],
                    with_cuda=with_cuda,
                    build_directory=str(build_dir),
                    is_python_module=True,  # the ops register on import; the module adds KeptSpmm
                    verbose=config.settings.verbose_build,
                )
            except Exception as failure:
                if not with_cuda:
                    raise
                error = compiler_error(failure)
                _write_note(note, key, error)
                raise NotedCudaFailure(error, note) from failure
            if with_cuda:
                with contextlib.suppress(OSError):
                    note.unlink(missing_ok=True)  # a failure for another toolkit
    finally:
        if with_cuda and saved_arch is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    return str(build_dir), module


@contextlib.contextmanager
def _exclusive(path: Path):
    """An exclusive lock on ``path`` for one build at a time; the kernel releases it when the
    process ends, however it ends (unlike torch's lock file, which a killed build leaves behind)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file is all there is
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_CUDA_FAILURE_NOTE = "cuda-build-failed.txt"


class NotedCudaFailure(Exception):
    """A CUDA build of these sources against this torch, toolkit and architectures failed (now, or
    earlier: then it is not tried again). The message is that build's error; ``note`` is the file
    to delete to try again."""

    def __init__(self, error: str, note: Path):
        super().__init__(error)
        self.note = note


def _cuda_toolkit_key() -> str:
    """What a CUDA build is for beyond its folder's name: the toolkit torch compiles with (where its
    path leads: /usr/local/cuda is often a link that an upgrade moves) and the architectures asked
    for (the user's setting, before fgplugin's default). A failure noted for another key is tried
    again."""
    from torch.utils.cpp_extension import CUDA_HOME

    toolkit = os.path.realpath(CUDA_HOME) if CUDA_HOME else None
    return f"CUDA_HOME={CUDA_HOME} ({toolkit})\nTORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', '')}\n"


def _raise_if_noted(note: Path, key: str) -> None:
    try:
        text = note.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    if text.startswith(key):
        raise NotedCudaFailure(text[len(key):].strip() or "unknown error", note)


def _write_note(note: Path, key: str, error: str) -> None:
    """Notes a failed CUDA build, whole or not at all (fgplugin.cache's atomic write); where the
    cache cannot be written, nothing is noted and the next process tries again."""
    with contextlib.suppress(OSError):
        write_atomically(note, (key + error + "\n").encode("utf-8"), private=False)


# The lines of a failed build's output that name its error, best first: a compiler's
# "file:line:col: error", nvcc's own, an #error, the linker's; then any line saying "error".
_ERROR_LINES = (re.compile(r":\d+(?::\d+)?: (?:fatal )?error\b"), re.compile(r"^nvcc (?:fatal|error)\b"),
                re.compile(r"#error\b"), re.compile(r"\bld(?:\.\w+)?: "), re.compile(r"\berror\b", re.IGNORECASE))


def compiler_error(error: Exception) -> str:
    """The line of a failed build's output that names the error (see ``_ERROR_LINES``), else its
    last line. torch's message is ninja's whole output: the line after each "FAILED:" is the
    command, whose paths may say "error" anywhere, and the last line is ninja's "build stopped"."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    commands = {i + 1 for i, line in enumerate(lines) if line.startswith("FAILED:")}
    told = [line for i, line in enumerate(lines)
            if i not in commands and not line.startswith(("FAILED:", "Error building extension"))]
    named = next((line for pattern in _ERROR_LINES for line in told if pattern.search(line)),
                 lines[-1] if lines else "")
    return f"{type(error).__name__}: {named[:300]}"


def _cuda_build() -> tuple[bool, str, tuple[str, object] | None]:
    """(CUDA kernels built?, why not, the build) for a plan that asks for them."""
    from torch.utils.cpp_extension import CUDA_HOME

    try:
        return True, "", _build_and_load(True)
    except NotedCudaFailure as noted:
        error, note = str(noted), noted.note
    except Exception as failure:  # before the compiler ran (the build folder); the CPU kernels are built next
        error, note = compiler_error(failure), _build_dir(True) / _CUDA_FAILURE_NOTE
    return False, (f"the CUDA build failed ({error}). If CUDA_HOME={CUDA_HOME} is not the CUDA toolkit's root "
                   "(bin/nvcc, include/cuda_runtime.h; torch guesses it from the nvcc on PATH), set CUDA_HOME, e.g. "
                   "to /usr/local/cuda; for another cause (the host compiler: CC, CXX) run with "
                   f"FGPLUGIN_VERBOSE_BUILD=1 to see the compiler's output. To build again, delete {note}"), None


def load() -> ExtensionStatus:
    """Build (first time) and load the kernels into ``torch.ops.fgplugin``; never raises."""
    global kept_spmm
    if status.loaded or status.reason:
        return status
    if not config.settings.build_extension:
        status.reason = "FGPLUGIN_NO_EXTENSION=1 is set"
        return status
    with_cuda, why_no_cuda = cuda_build_plan()
    try:
        built = None
        if with_cuda:
            with_cuda, why_no_cuda, built = _cuda_build()
        status.build_dir, module = built or _build_and_load(False)
    except Exception as error:  # a failed build must leave fgplugin usable on the reference path
        status.reason = compiler_error(error)
        warnings.warn(
            "fgplugin could not build its C++ extension against torch "
            f"{torch.__version__} ({status.reason}). Falling back to the pure-torch reference kernels, which "
            "are correct but slow. To fix: install a C++ compiler (g++) and ninja (`pip install ninja`), "
            "and for GPUs a CUDA toolkit matching torch.version.cuda with CUDA_HOME set; run with "
            "FGPLUGIN_VERBOSE_BUILD=1 to see the compiler output.",
            ExtensionBuildWarning,
            stacklevel=3,
        )
        return status
    kept_spmm = module.KeptSpmm
    status.loaded = True
    status.cuda = with_cuda
    if not with_cuda and torch.version.cuda is not None:
        status.reason = f"CUDA kernels not built: {why_no_cuda}; CUDA tensors use the reference path"
        warnings.warn(f"fgplugin: {status.reason}", ExtensionBuildWarning, stacklevel=3)
    return status
