"""The repository is self-contained: its docs live in docs/, nothing tracked points outside the
repository to the shared notes, every relative link in the README and docs/ resolves, and the testbed's
library example (docs/testbed.md) runs as shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = ("method.md", "design.md", "vllm-cpu.md", "testbed.md")
OUTSIDE = ("../" + "shared", "/work/" + "shared", "shared/" + "DESIGN.md", "shared/" + "PAPER.md",
           "shared/" + "VLLM-CPU.md")  # spelled in pieces so that this file does not match itself


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [REPO / p for p in out.decode().split("\0") if p]


def test_docs_exist_and_are_substantial():
    for name in DOCS:
        text = (REPO / "docs" / name).read_text()
        assert len(text.splitlines()) > 40, name
    method = (REPO / "docs" / "method.md").read_text()
    # the paper's numbers and protocol are here, not only in notes outside the repository
    assert "51.67 / 31.67" in method and "3,150 instances" in method and "V6" in method


def test_no_tracked_file_refers_outside_the_repository():
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue  # binary files (PNGs, ...), or a file deleted in the working tree
        for needle in OUTSIDE:
            if needle in text:
                offenders.append(f"{path.relative_to(REPO)}: {needle}")
    assert not offenders, offenders


def test_readme_links_the_docs_and_every_relative_link_resolves():
    readme = (REPO / "README.md").read_text()
    for name in DOCS:
        assert f"(docs/{name})" in readme
    for page in [REPO / "README.md", *(REPO / "docs" / n for n in DOCS)]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to missing {target}"


def test_testbed_library_example_runs():
    page = (REPO / "docs" / "testbed.md").read_text()
    section = page.split("## The testbed as a Python library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:3] == ["True True 1.0", "1.0", "[1.0, 1.0]"]
