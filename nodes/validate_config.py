"""Check the engineer's proposal and decide what the next stage trains on.

The proposal is checked once by the run's family (`families/base.py` `LoopFamily.check`: one pure function, its
strict check, a repair of shares off only by rounding, its projection onto the legal space, and its feasibility
test where it has one), and what becomes of it is decided by one policy for every family
(`families/policy.py` `decide`; docs/design.md defines each decision):
- no proposal (the reply had no usable JSON; the reason comes from `propose_config` through `state["feedback"]`)
  is unusable;
- valid as proposed -> "accepted"; invalid only by rounding (shares summing to 0.999, percentages summing to 100)
  -> "normalised" at once;
- outside the legal space (or infeasible) -> "retry" with the reason while `attempts <
  settings.engineer_max_attempts`; on the last attempt the nearest valid config -> "projected", else the current
  config is kept -> "kept_previous" and passed on as `accepted`.

For MAPF-FrozenLake the strict check is `EnvConfig.model_validate` of the proposal's `sizes` with the run-level
fields (`num_agents`, `num_instances`) taken from the current config (such keys, and any other top-level key, are
dropped with a note), the projection the paper's (`env.project`), and the feasibility test a dry-run of the
generator on `settings.feasibility_n` instances (an exception or a severe shortfall makes it unusable).

Every decision (with reason, errors, notes, feasibility and the diff against the current config, the family's
`diff`) is appended to `stage_<k>/validation.json`. Any proposal ends in a decision, never a crash: an error of any
kind while checking it (a number too large, nesting too deep) is recorded as its reason. The proposal itself is
stored as JSON cut at `MAX_STORED_DEPTH` levels of nesting, or, when it is still too large, as a JSON string of
its first `MAX_STORED_CHARS` characters.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families import family_of
from families.policy import Checked, decide, may_project
from trainer.files import stage_dir, write_json_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext
    from graph.state import LoopState

MAX_STORED_DEPTH = 32  # validation.json keeps a proposal's nesting down to this depth (a config needs 3)
MAX_STORED_CHARS = 20_000  # ... and at most this many characters of it
# Errors a malformed proposal can raise while it is stored (a number past Python's digit limit, deep nesting)
CHECK_ERRORS = (TypeError, ValueError, ArithmeticError, RecursionError)
REASONS = {
    "accepted": "the proposal passed strict validation",
    "normalised": "the proposal was off only by rounding and was normalised",
    "projected": "the proposal failed strict validation and was projected",
    "retry": "unusable proposal (attempt {attempt} of {max_attempts}); errors sent back to the engineer",
    "kept_previous": "unusable proposal after {attempt} attempt(s); the current config is kept",
}


def check_seed(seed: Any, stage: int, attempt: int) -> int:
    """The seed of an attempt's feasibility dry-run (a stable hash of the run seed, the stage and the attempt)."""
    return int(hashlib.sha256(f"feasibility:{seed}:{stage}:{attempt}".encode()).hexdigest()[:8], 16)


def validate_config(state: LoopState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Node: check the engineer's proposal with the run's family (`LoopFamily.check`, projecting only on the last
    attempt) and decide under the one policy (`families.policy.decide`).

    Reads state: stage, config (current), proposal, feedback (extraction errors when proposal is None),
    attempts, rationale. Returns: accepted (the config dump, or None on "retry"), decision, feedback (errors
    for the engineer; [] when used), attempts, log.
    """
    settings, run_dir = runtime.context.settings, runtime.context.run_dir
    family = family_of(settings)
    stage = int(state.get("stage") or 0)
    attempts = int(state.get("attempts") or 1)
    max_attempts = settings.engineer_max_attempts
    current = state["config"]
    proposal = state.get("proposal")
    if proposal is None:
        checked = Checked(None, errors=list(state.get("feedback") or ["no usable JSON object in the reply"]))
    else:
        checked = family.check(proposal, current, settings, seed=check_seed(settings.seed, stage, attempts),
                               repair=may_project(attempts, max_attempts))
    decision = decide(checked, attempts, max_attempts)
    accepted = checked.config if checked.config is not None else (None if decision == "retry" else current)
    reason = REASONS[decision].format(attempt=attempts, max_attempts=max_attempts)
    if decision in ("projected", "normalised") and checked.notes:
        reason += f" ({len(checked.notes)} change(s))"
    record = {
        "attempt": attempts,
        "decision": decision,
        "reason": reason,
        "errors": checked.errors,
        "notes": checked.notes,
        "proposal": stored_proposal(proposal),
        "rationale": state.get("rationale", ""),
        "reply": state.get("reply"),  # an empty or cut reply, named (propose_config)
        "diff": family.diff(current, accepted) if accepted is not None else {},
        "feasibility": _brief(checked.feasibility),
        "accepted": accepted,
    }
    _append_record(stage_dir(run_dir, stage) / "validation.json", stage, record)
    word = family.shape.word
    return {
        "accepted": accepted,
        "decision": decision,
        "feedback": [] if checked.config is not None else checked.errors,
        "attempts": attempts,
        "log": [
            f"stage {stage}: validation attempt {attempts}: {decision} ({len(record['diff'])} {word}(s) changed)"
            + (f"; {checked.errors[0][:160]}" if checked.errors else "")
        ],
    }


def _brief(feas: dict | None) -> dict | None:
    if feas is None:
        return None
    return {k: v for k, v in feas.items() if k != "stats"} | {"stats": _jsonable(feas.get("stats"))}


def _jsonable(obj: Any, max_depth: int | None = None, depth: int = 0) -> Any:
    """A strict-JSON copy: non-finite floats (NaN, inf from a proposal) become strings, and with
    `max_depth` a container nested that deep a placeholder string (the copy then recurses at most
    `max_depth` levels, however deep `obj` is)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict | list | tuple) and max_depth is not None and depth >= max_depth:
        return f"[{type(obj).__name__} nested deeper than {max_depth} levels: not stored]"
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, max_depth, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v, max_depth, depth + 1) for v in obj]
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return str(obj)


def stored_proposal(proposal: Any) -> Any:
    """The proposal as validation.json keeps it: a strict-JSON copy cut at `MAX_STORED_DEPTH` levels of
    nesting (see `_jsonable`); when that copy is longer than `MAX_STORED_CHARS`, a JSON string holding its
    first `MAX_STORED_CHARS` characters and saying how much was cut; a placeholder string when it cannot
    be written at all (an integer past Python's digit limit)."""
    try:
        copy = _jsonable(proposal, MAX_STORED_DEPTH)
        text = json.dumps(copy, ensure_ascii=False, allow_nan=False)
    except CHECK_ERRORS as e:
        return f"[proposal not storable as JSON: {type(e).__name__}]"[:MAX_STORED_CHARS]
    if len(text) <= MAX_STORED_CHARS:
        return copy
    return text[:MAX_STORED_CHARS] + f" [... {len(text) - MAX_STORED_CHARS} more characters cut]"


def _append_record(path: Path, stage: int, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"stage": stage, "decisions": []}
    if path.is_file() and record["attempt"] > 1:
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            pass
    doc["decisions"] = [d for d in doc.get("decisions", []) if d.get("attempt") != record["attempt"]] + [
        record
    ]
    doc["final"] = record["decision"] if record["decision"] != "retry" else None
    write_json_atomic(path, _jsonable(doc), allow_nan=False)


def record_person(run_dir: Path, stage: int, attempts: int, record: dict[str, Any]) -> None:
    """A person's answer at the `--approve` prompt (graph.approve), written by this node's one writer of
    validation.json: numbered after the engineer's `attempts`, marked `by: person`, and made final."""
    _append_record(stage_dir(run_dir, stage) / "validation.json", stage,
                   {"attempt": attempts + 1, "by": "person", **record})
