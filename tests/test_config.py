"""fgplugin.config: every environment switch read in one place and listed in docs/design.md."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fgplugin
from fgplugin import config

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_list_every_switch_as_config_does():
    design = (ROOT / "docs" / "design.md").read_text()
    assert config.table() in design, "docs/design.md's configuration table differs from config.table()"


def test_no_switch_is_read_outside_config():
    """Only fgplugin/config.py reads FGPLUGIN_* variables (the C++ sources read none)."""
    readers = []
    for path in [*(ROOT / "fgplugin").rglob("*.py"), *(ROOT / "adapters").rglob("*.py"),
                 *(ROOT / "csrc").rglob("*.c*"), *(ROOT / "csrc").rglob("*.h")]:
        text = path.read_text()
        if path.name != "config.py" and re.search(r"(environ|getenv)\W+[^\n]*FGPLUGIN_", text):
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []
    names = set(re.findall(r"FGPLUGIN_[A-Z_]+", (ROOT / "fgplugin" / "config.py").read_text()))
    assert names == {v.name for v in config.VARIABLES}


def test_setters_return_the_previous_setting():
    for setter, field in ((fgplugin.set_input_cache, "input_cache"), (fgplugin.set_row_skipping, "skip_zero_rows"),
                          (config.set_block_adaptive, "block_adaptive"), (config.set_wgmma, "wgmma")):
        before = getattr(config.settings, field)
        assert setter(not before) is before and getattr(config.settings, field) is (not before)
        assert setter(before) is (not before) and getattr(config.settings, field) is before


@pytest.mark.parametrize("name, field", [("FGPLUGIN_SPARSE_INPUT", "sparse_input"), ("FGPLUGIN_CUSPARSE", "cusparse")])
def test_three_way_switches_are_read_and_checked(name, field):
    """auto / 0 / 1 and their common spellings; anything else is an error at import that says
    what to set."""
    read = f"import fgplugin; print(fgplugin.config.settings.{field})"
    for value, mode in (("0", "0"), ("true", "1"), ("", "auto")):
        env = {**os.environ, name: value}
        out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == mode, out.stderr[-2000:]
    env = {**os.environ, name: "sometimes"}
    out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and f"{name} must be auto, 0 or 1" in out.stderr


@pytest.mark.parametrize("name, field, default", [("FGPLUGIN_INPUT_CACHE", "input_cache", True),
                                                  ("FGPLUGIN_SKIP_ZERO_ROWS", "skip_zero_rows", True)])
def test_on_off_switches_take_the_same_spellings_and_refuse_others(name, field, default):
    """0 / 1 and true/false, on/off, yes/no; unset or empty is the default; anything else is an
    error at import, never read as "on"."""
    read = f"import fgplugin; print(fgplugin.config.settings.{field})"
    for value, expected in (("0", False), ("false", False), ("Off", False), ("1", True), ("yes", True), ("", default)):
        env = {**os.environ, name: value}
        out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.strip() == str(expected), (value, out.stderr[-2000:])
    env = {**os.environ, name: "2"}
    out = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and f"{name} must be 0 or 1, got '2'" in out.stderr
