"""The README stays short and true: its links resolve, it names no folder outside the repository,
and its core-API example runs as printed."""
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_is_short():
    assert len(README.splitlines()) <= 150


def test_links_and_named_files_exist():
    targets = re.findall(r"\]\(([^)#]+)\)", README)
    targets += [f"benchmarks/results/{p}" for p in re.findall(r"`((?:h100|h200\w*|cpu)/[\w./-]+\.json)`", README)]
    targets += re.findall(r"`((?:examples|docs)/[\w./-]+)`", README)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def test_nothing_outside_the_repository_is_referenced():
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        assert "../shared" not in path.read_text(), path


def test_the_core_api_example_runs():
    code = re.search(r"```python\n(import torch, fgplugin\n.*?)```", README, re.S).group(1)
    num_nodes = 50
    edge_index = torch.randint(0, num_nodes, (2, 300))
    x = torch.randn(num_nodes, 8)
    scope = {"edge_index": edge_index, "num_nodes": num_nodes, "x": x}
    exec(code, scope)
    assert scope["out"].shape == (num_nodes, 8)
