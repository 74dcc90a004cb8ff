"""The run folder as the unit of identity, ownership and integrity.

- Identity: a run's LangGraph thread id is `settings.run_id`, written into settings.json when the run
  starts (the folder's name then) and read back on resume, so a renamed, moved, copied or symlinked run,
  or `--resume .`, finds its own checkpoints. A run from before `run_id` existed uses the one thread its
  graph.sqlite holds (or, with several, the one named like the folder).
- Paths in the state (`graph.state.PATH_KEYS`) are stored relative to the run folder and resolved
  against the folder being run (`in_run_folder` wraps every node), so a copy never reads its original.
  An absolute path from an older state that points into another run folder's `stage_<k>/` or `final/`
  is moved into this one when the same file exists here (a copied run of the old layout).
- Ownership: `RunLock` holds an OS lock (`fcntl.flock`) on `run.lock` in the folder for the life of the
  process; the kernel releases it on any exit, kill -9 included. A second process is refused with one
  line naming the PID that holds it.
- Integrity: `database_problem` says why graph.sqlite cannot be used (missing, empty, not a database,
  damaged); `finished_stages` lists the stages whose training or evaluation finished, which a run must
  never redo because its state was lost.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

LOCK_FILE = "run.lock"
DB_FILE = "graph.sqlite"


class RunFolderError(RuntimeError):
    """The run folder cannot be used as it is: one line naming the file and what to do."""


# ----------------------------------------------------------------------------- ownership


class RunLock:
    """`fcntl.flock` on `run_dir/run.lock`, held until `release()` or the process ends."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunFolderError(f"cannot lock {self.path}: {e.strerror}") from None
            holder = _read_pid(self.path)
            who = f"process {holder}" if holder else "another process"
            raise RunFolderError(
                f"{self.path.parent} is in use by {who} (it holds {self.path.name}); one process per run "
                f"folder: wait for it to end{f' or stop it (kill {holder})' if holder else ''}, then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# ----------------------------------------------------------------------------- integrity


def database_problem(run_dir: Path) -> str | None:
    """None when graph.sqlite is a readable database (a new run's may not exist yet: see `exists`), else
    why not: "missing", "empty (0 bytes)", "not a database (...)" or "damaged (...)"."""
    db = Path(run_dir) / DB_FILE
    if not db.exists():
        return "missing"
    if db.is_file() and db.stat().st_size == 0:
        return "empty (0 bytes)"
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as e:
        return f"not a database ({e})"
    if rows != [("ok",)]:
        return f"damaged ({'; '.join(str(r[0]) for r in rows[:2])[:200]})"
    if "checkpoints" not in tables:
        return "holds no LangGraph checkpoints table"
    return None


def threads(run_dir: Path) -> list[str]:
    """Thread ids with checkpoints in graph.sqlite (read-only; [] when it has none)."""
    db = Path(run_dir) / DB_FILE
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return [r[0] for r in conn.execute("SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id")]
        finally:
            conn.close()
    except sqlite3.Error:
        return []


def folder_name(run_dir: Path) -> str:
    """The folder's own name, also for `.` or a path ending in `..`."""
    return Path(os.path.abspath(run_dir)).name


def thread_id(run_dir: Path, run_id: str | None) -> str:
    """The run's LangGraph thread id: `run_id` from settings.json, else (a run from before run_id) the one
    thread graph.sqlite holds, the one named like the folder, or the folder's name for an empty database."""
    if run_id:
        return run_id
    name = folder_name(run_dir)
    names = threads(run_dir)
    if not names or name in names:
        return name
    if len(names) == 1:
        return names[0]
    raise RunFolderError(
        f"{Path(run_dir) / DB_FILE} holds the checkpoints of several runs ({', '.join(names[:5])}) and "
        "settings.json names none of them (no run_id); add \"run_id\": \"<one of them>\" to settings.json"
    )


_STAGE_DIR = re.compile(r"stage_\d+|final")


def finished_stages(run_dir: Path) -> list[str]:
    """`stage_<k>` (and `final`) folders holding finished work: a trained checkpoint, answers or metrics.
    A folder with only apply's files (config.json, train.jsonl) is not finished: apply rebuilds it."""
    out = []
    for d in sorted(Path(run_dir).iterdir(), key=lambda p: (len(p.name), p.name)) if Path(run_dir).is_dir() else []:
        if not (d.is_dir() and _STAGE_DIR.fullmatch(d.name)):
            continue
        ckpt = d / "checkpoint"
        if (ckpt.is_dir() and any(ckpt.iterdir())) or (d / "eval.jsonl").exists() or (d / "metrics.json").exists():
            out.append(d.name)
    return out


# ----------------------------------------------------------------------------- paths in the state


def _under(path: str, run_dir: Path) -> str | None:
    """`path` relative to `run_dir` (as given or with symlinks resolved), None when it lies outside."""
    for base in {os.path.abspath(run_dir), os.path.realpath(run_dir)}:
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            if p == base or p.startswith(base + os.sep):
                return os.path.relpath(p, base)
    return None


def relative_to_run(value: Any, run_dir: Path) -> Any:
    """A path string inside `run_dir` as a path relative to it (POSIX separators); anything else as is."""
    if not isinstance(value, str) or not value:
        return value
    rel = _under(value, run_dir) if os.path.isabs(value) or os.path.exists(value) else None
    return Path(rel).as_posix() if rel is not None else value


def resolve_in_run(value: Any, run_dir: Path) -> Any:
    """A stored path as a path the nodes can open: relative ones against `run_dir`; an absolute one that
    points into another run folder's `stage_<k>/` or `final/` (an old state in a copied folder) moved here
    when the same file exists here."""
    if not isinstance(value, str) or not value:
        return value
    run_dir = Path(os.path.abspath(run_dir))
    if not os.path.isabs(value):
        return str(run_dir / value)
    if _under(value, run_dir) is not None:
        return value
    parts = Path(value).parts
    for i in range(len(parts) - 1, 0, -1):
        if _STAGE_DIR.fullmatch(parts[i]):
            moved = run_dir.joinpath(*parts[i:])
            return str(moved) if moved.exists() else value
    return value


def state_paths(values: dict, run_dir: Path, how) -> dict:
    """`values` with `how(value, run_dir)` applied to every key of graph.state.PATH_KEYS it holds."""
    from graph.state import PATH_KEYS

    if not isinstance(values, dict) or not any(k in values for k in PATH_KEYS):
        return values
    return {k: how(v, run_dir) if k in PATH_KEYS else v for k, v in values.items()}


def in_run_folder(node):
    """`node` as the graph runs it: state paths resolved against the run folder going in (the nodes open
    them), and stored relative to it coming out (so the state moves with the folder). Once a stop was
    requested (trainer.stop) it raises `StageInterrupted` instead of starting the node."""

    @functools.wraps(node)
    def run(state, runtime):
        from trainer.stop import StageInterrupted, stop_requested

        if stop_requested():  # SIGINT/SIGTERM: no node starts after it; the state stays at this node
            raise StageInterrupted(f"stopped before {getattr(node, '__name__', 'a node')}")
        run_dir = runtime.context.run_dir
        update = node(state_paths(state, run_dir, resolve_in_run), runtime)
        return state_paths(update, run_dir, relative_to_run)

    return run


# ----------------------------------------------------------------------------- checkpoints


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is unusable (header unreadable, data shorter than the header says), or None."""
    import json
    import struct

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{path.name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                return f"{path.name} is not a safetensors file (header length {n}, file {size} bytes)"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"{path.name} cannot be read ({type(e).__name__})"
    if not isinstance(header, dict):
        return f"{path.name} has no tensor table"
    ends = [v["data_offsets"][1] for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
            and len(v["data_offsets"]) == 2 and isinstance(v["data_offsets"][1], int)]
    if 8 + n + max(ends, default=0) > size:
        return f"{path.name} is truncated ({size} bytes, its header needs {8 + n + max(ends)})"
    return None


def checkpoint_problem(path: Path) -> str | None:
    """Why a policy checkpoint folder cannot be loaded ("missing", "incomplete (...)", "damaged (...)"),
    or None. Checks the files, not the numbers: config or adapter config, weights, safetensors headers."""
    path = Path(path)
    if not path.exists():
        return "missing"
    if not path.is_dir():
        return "not a folder"
    if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        return "incomplete (no config.json or adapter_config.json)"
    weights = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    if not weights:
        return "incomplete (no weights: *.safetensors or *.bin)"
    for w in weights:
        if w.suffix == ".safetensors":
            bad = _safetensors_problem(w)
            if bad:
                return f"damaged ({bad})"
    return None
