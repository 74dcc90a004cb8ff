"""Where a stage's files go, and atomic file writes for everything a run writes into its folder.

Each writer puts the bytes into a temporary file in the target's own folder and renames it over the
target (`os.replace`). Why: a reader (a resumed run, the report, a person) never sees half a file, and a
file that is a hard link to another run's file (a fork's stage 0, graph/stage0.py) is replaced by a new
inode instead of being modified in place, so the donor's bytes never change.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


class RunFileError(RuntimeError):
    """A file of the run folder that a node cannot use: one line naming the file and how to repair it
    (graph.run prints it with the resume command)."""


STAGE_PREFIX = "stage_"


def stage_dir(run_dir: str | os.PathLike, stage: int) -> Path:
    """`<run_dir>/stage_<stage>`, the folder of one stage's files (its config and data, checkpoint,
    evaluation, the engineer's prompt and reply): the one place that names it. Not created here; the
    writers below create their file's folder."""
    return Path(run_dir) / f"{STAGE_PREFIX}{stage}"


def stage_numbers(run_dir: str | os.PathLike) -> list[int]:
    """The stages that have a folder in `run_dir` (as `stage_dir` names it), in order."""
    found = (d.name.removeprefix(STAGE_PREFIX) for d in Path(run_dir).glob(f"{STAGE_PREFIX}*"))
    return sorted(int(k) for k in found if k.isdigit())


def weights_sha256(folder: str | os.PathLike) -> dict[str, str]:
    """The sha256 of every weight file (`*.safetensors`) directly in `folder`, by file name, as `sha256sum`
    prints it: what identifies a checkpoint's weights wherever its folder lies ({} when it has none)."""
    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            out[f.name] = hashlib.file_digest(fh, "sha256").hexdigest()
    return out


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename; returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; run files are read by other tools and people
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`write_bytes_atomic` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def append_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`path`'s current text (none when it does not exist) plus `text`, written atomically: an append that
    never writes through a hard link."""
    path = Path(path)
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    return write_bytes_atomic(path, old + text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, **kw: Any) -> Path:
    """`obj` as JSON (indented, newline-terminated; `kw` go to `json.dumps`), written atomically."""
    kw.setdefault("ensure_ascii", False)
    return write_text_atomic(path, json.dumps(obj, indent=indent, **kw) + "\n")
