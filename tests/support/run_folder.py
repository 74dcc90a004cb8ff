"""Reading a run folder the way the end-to-end tests check it."""

from __future__ import annotations

from pathlib import Path


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time of every file below `folder` (a rewrite or a retrain changes the mtimes)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def train_stage_runs(run_dir: Path) -> list[int]:
    """Stages whose train_stage node finished, one entry per finished run of the node: each finished
    node's update is in the graph's checkpointed state (graph.sqlite), and train_stage logs one line."""
    import re
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(run_dir / "graph.sqlite", check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        latest = saver.get_tuple({"configurable": {"thread_id": run_dir.name}})
        assert latest is not None, "no checkpoint in graph.sqlite"
        lines = latest.checkpoint["channel_values"].get("log") or []
        return sorted(int(m.group(1)) for ln in lines if (m := re.match(r"stage (\d+): trained ", ln)))
    finally:
        conn.close()


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
