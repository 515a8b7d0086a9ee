"""ops/setup.sh is the one place that installs Sluice into .venv, and it skips the pip install when nothing it
installs from changed: its stamp (.venv/.sluice-setup-stamp) holds the hash of pyproject.toml and of the script
itself. ops/test.sh and ops/train_local.sh call it rather than keeping a stamp of their own."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPS = REPO / "ops"
STAMP = ".venv/.sluice-setup-stamp"


def test_the_scripts_that_need_the_venv_call_setup():
    for script in ("test.sh", "train_local.sh"):
        assert "bash ops/setup.sh" in (OPS / script).read_text(), script


def test_only_setup_keeps_the_stamp():
    holders = [path.name for path in OPS.glob("*.sh") if "sluice-setup-stamp" in path.read_text()]
    assert holders == ["setup.sh"]


def test_setup_installs_only_when_the_stamp_differs_from_pyproject_and_itself():
    text = (OPS / "setup.sh").read_text()
    assert f"STAMP={STAMP}" in text
    assert re.search(r"want=\$\(cat pyproject\.toml ops/setup\.sh \| sha256sum", text)
    install = text.index('pip install --quiet -e ".[test]"')
    guard = text.rindex('if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]', 0, install)
    assert text.index('echo "$want" > "$STAMP"', install) > install > guard  # written after a successful install
