"""Builds the C++/CUDA extension against the installed torch on first import, and caches it.

Why at first use and not at install: building at install time needs torch inside pip's isolated
build environment, which makes pip download a second torch. Here the sources (shipped as
``fgplugin._csrc``) are compiled with ``torch.utils.cpp_extension.load`` into a cache folder keyed
by the torch version, the CUDA flavour and a hash of the sources, so an upgrade of either
rebuilds and a second import loads in well under a second.

CUDA kernels are compiled when torch is a CUDA build and a CUDA toolkit (nvcc) is found
(``CUDA_HOME``), whether or not a GPU is visible, so a GPU-less build host still produces them
``TORCH_CUDA_ARCH_LIST`` picks the GPU architectures (default here: "8.0;9.0a", or "8.0;9.0"
with nvcc < 12; a list without "9.0a" builds no wgmma kernel, and Hopper GPUs then run the
mma.sync one); ``MAX_JOBS`` caps the compiler's parallelism.

If the build fails, fgplugin warns once with the reason and the fix, and the ops run on the
pure-torch reference path (fgplugin/reference.py).

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


def _build_and_load(with_cuda: bool) -> tuple[str, object]:
    """(the build folder, the loaded extension module)."""
    from torch.utils import cpp_extension

    flavour = f"cu{torch.version.cuda}" if with_cuda else "cpu"
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"torch{torch.__version__}-{flavour}-py{sys.version_info[0]}{sys.version_info[1]}")
    src_hash = _sources_hash()
    build_dir = config.cache_dir() / "ext" / f"{tag}-{src_hash}"
    build_dir.mkdir(parents=True, exist_ok=True)
    name = f"fgplugin_ops_{src_hash}"
    verbose = config.settings.verbose_build
    if not (build_dir / f"{name}.so").exists():
        print(f"fgplugin: compiling the {'CPU+CUDA' if with_cuda else 'CPU'} kernels for torch {torch.__version__} "
              f"into {build_dir} (once; about a minute)", file=sys.stderr, flush=True)
    saved_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if with_cuda and saved_arch is None:
        os.environ["TORCH_CUDA_ARCH_LIST"] = default_cuda_archs(
            _nvcc_version(cpp_extension.CUDA_HOME) if cpp_extension.CUDA_HOME else None)
    try:
        with _exclusive(build_dir / "fgplugin-build.lock"):
            # torch's own lock file of a build that was killed would make this wait forever: holding
            # ours, no other fgplugin process is building here, so any such file is stale.
            (build_dir / "lock").unlink(missing_ok=True)
            module = cpp_extension.load(
                name=name,
                sources=[str(p) for p in _sources(with_cuda)],
                extra_cflags=["-O3", *openmp_flags()],
                extra_ldflags=openmp_flags(),
                extra_cuda_cflags=["-O3", "-lineinfo"],
                with_cuda=with_cuda,
                build_directory=str(build_dir),
                is_python_module=True,  # the ops register on import; the module adds KeptSpmm
                verbose=verbose,
            )
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
        status.build_dir, module = _build_and_load(with_cuda)
    except Exception as error:  # a failed build must leave fgplugin usable on the reference path
        status.reason = f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"
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
