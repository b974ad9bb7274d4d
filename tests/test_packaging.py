"""pyproject.toml ships every package of the source tree (its package list is explicit) and builds
with the setuptools it asks for."""
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    missing = found - set(config["packages"])
    assert not missing, f"add these to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def _modules() -> dict[str, Path]:
    """Every module of the installed package by dotted name (adapters/ ships as fgplugin.pyg/.dgl)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = {}
    for name, folder in sorted(config["package-dir"].items()):
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            dotted = ".".join((name, *parts[:-1], *([] if parts[-1] == "__init__" else parts[-1:])))
            modules.setdefault(dotted, path)  # fgplugin/pyg does not exist: adapters/pyg is fgplugin.pyg
    return modules


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The package modules ``name`` imports, at module level or inside functions."""
    import ast

    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_no_import_cycles_in_the_package():
    """The package's modules import each other in one direction only (counting imports inside
    functions too): no module can half-initialize another."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_build_requirement_reads_the_license_fields():
    """An SPDX ``license`` string and ``license-files`` need setuptools >= 77 (PEP 639): with an
    older one in the build environment (``--no-build-isolation`` in a fresh venv) the metadata
    step fails on them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if not (isinstance(config["project"].get("license"), str) or "license-files" in config["project"]):
        pytest.skip("no PEP 639 license fields in pyproject.toml")
    from packaging.requirements import Requirement
    from packaging.version import Version

    setuptools = next(Requirement(r) for r in config["build-system"]["requires"] if Requirement(r).name == "setuptools")
    assert setuptools.specifier.contains(Version("77")), setuptools
    assert not setuptools.specifier.contains(Version("76.9")), f"raise the build requirement to setuptools>=77: {setuptools}"
