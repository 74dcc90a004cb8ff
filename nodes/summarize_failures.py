"""The summarize_failures node: the engineer's context for the stage just evaluated, written to stage_k/summary.md.

What the context holds is the run's task family's (`families/base.py` `LoopFamily.context`): for MAPF-FrozenLake the
paper's context modules (F, G, H, S, T, E, X; `families/evidence.py`, the variant from `settings.context`), for a
level-share family its rates and failures per level, its history of shares, its last rationale and verbatim failing
answers (`families/level_share.py`). Policy text in it is fenced as untrusted either way (`families/evidence.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families import family_of
from trainer.files import RunFileError, stage_dir, write_text_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext
    from graph.state import LoopState


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_rows(path: Path) -> list[dict]:
    """The JSON rows of an eval.jsonl (lines that do not decode are skipped); `RunFileError` (one line)
    for a file that is not UTF-8 text."""
    if not path.is_file():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunFileError(
            f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): the stage's saved "
            "answers are damaged; put the file back from a copy of the run, then resume"
        ) from None
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def summarize_failures(state: LoopState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Node: compose the engineer's context for the stage just evaluated from stage_k/{eval.jsonl,
    env_stats.json} (the run's family's `context`); writes stage_k/summary.md and returns {"context"}."""
    settings = runtime.context.settings
    stage = int(state.get("stage") or 0)
    out_dir = stage_dir(runtime.context.run_dir, stage)
    context = family_of(settings).context(state, settings, _read_rows(out_dir / "eval.jsonl"),
                                          _read_json(out_dir / "env_stats.json"))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / "summary.md", context)
    return {"context": context}
