"""Check the engineer's proposal and decide what the next stage trains on.

The checks are those of the run's family's answer format (`nodes/family.py` `LoopFamily.answer_key`,
`VALIDATORS`): a level-share family's proposal (`validate_task`) is accepted as proposed, sent back while attempts
remain, then projected onto the nearest valid config or the current one kept. MAPF-FrozenLake's (`validate_sizes`)
goes through these checks, in order, each recorded:
1. Extraction: no proposal (the reply had no usable JSON) is unusable; the reason comes from
   `propose_config` through `state["feedback"]`.
2. Strict validation: `EnvConfig.model_validate` of the proposal's `sizes` with the run-level fields
   (`num_agents`, `num_instances`) taken from the current config: the engineer cannot change them, so
   such keys (and any other top-level key) are dropped with a note. Passing -> "accepted".
3. Projection (the paper's path): `env.project` clips, renormalises, caps and fills, with a note per
   change -> "projected". A proposal not even shaped like a config (`ValueError`) is unusable.
4. Feasibility dry-run: the generator draws `settings.feasibility_n` instances (default 16; Settings
   requires at least 1, so every usable proposal is dry-run) from the candidate; an exception or a severe shortfall (fewer than half the asked instances overall,
   or at a size asked for at least 4) makes it unusable.

An unusable proposal goes back to the engineer with the errors ("retry") while `attempts <
settings.engineer_max_attempts`; after that the current config is kept ("kept_previous") and passed on as
`accepted`. Every decision (with reason, errors, notes, feasibility and the diff against the current
config: per-size knobs, or per-level shares, `DIFFS`) is appended to `stage_<k>/validation.json`. Any proposal ends in a decision, never a crash: an
error of any kind while checking it (a number too large, nesting too deep) is recorded as its reason. The
proposal itself is stored as JSON cut at `MAX_STORED_DEPTH` levels of nesting, or, when it is still too
large, as a JSON string of its first `MAX_STORED_CHARS` characters.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from env import EnvConfig, generate, project
from env.config import format_validation_error
from nodes.family import family_of
from nodes.task_loop import check
from nodes.task_loop import project as project_levels
from trainer.files import stage_dir, write_json_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext, Settings
    from graph.state import LoopState

KNOBS = ("data_ratio", "hole_ratio", "wait_ratio")
SHORTFALL = 0.5  # a size (or the whole draw) that gets less than this share of what it asked is infeasible
MAX_STORED_DEPTH = 32  # validation.json keeps a proposal's nesting down to this depth (a config needs 3)
MAX_STORED_CHARS = 20_000  # ... and at most this many characters of it
# Errors a malformed proposal can raise while it is checked (beyond pydantic's): a huge number
# (OverflowError is an ArithmeticError) or a deeply nested value (RecursionError).
_CHECK_ERRORS = (TypeError, ValueError, ArithmeticError, RecursionError)


def config_diff(old: dict | None, new: dict) -> dict[str, dict[str, dict[str, float]]]:
    """`{"5": {"hole_ratio": {"from": 0.1, "to": 0.3}}, ...}`: every knob that moved by more than 1e-9."""
    old_sizes = {str(k): v for k, v in ((old or {}).get("sizes") or {}).items()}
    out: dict[str, dict] = {}
    for s, knobs in ((new or {}).get("sizes") or {}).items():
        prev = old_sizes.get(str(s)) or {}
        for k in KNOBS:
            a, b = prev.get(k), knobs.get(k)
            if a is None or b is None or abs(float(a) - float(b)) > 1e-9:
                out.setdefault(str(s), {})[k] = {"from": a, "to": b}
    return out


def levels_diff(old: dict | None, new: dict | None) -> dict[str, dict[str, dict[str, float]]]:
    """A level-share config's diff: `{"<level>": {"share": {"from": a, "to": b}}, ...}`, every level whose share
    moved by more than 1e-9 (a level a config leaves out has share 0)."""

    def shares(cfg: dict | None) -> dict[int, float]:
        levels = (cfg or {}).get("levels")
        return {int(k): float(v) for k, v in levels.items()} if isinstance(levels, dict) else {}

    a, b = shares(old), shares(new)
    return {str(k): {"share": {"from": a.get(k, 0.0), "to": b.get(k, 0.0)}}
            for k in sorted(set(a) | set(b)) if abs(a.get(k, 0.0) - b.get(k, 0.0)) > 1e-9}


# validation.json's `diff` of a proposal against the current config, by the family's answer format
# (`LoopFamily.answer_key`): MAPF-FrozenLake's per-size knobs, or another task's level shares.
DIFFS = {"sizes": config_diff, "levels": levels_diff}


def proposal_diff(old: dict | None, new: dict | None, settings: Settings) -> dict[str, dict[str, dict[str, Any]]]:
    """The `diff` validation.json records for the run's family (`DIFFS`); the progress line words it."""
    return DIFFS[family_of(settings).answer_key](old, new)


def _stage_seed(seed: Any, stage: int, attempt: int) -> int:
    return int(hashlib.sha256(f"feasibility:{seed}:{stage}:{attempt}".encode()).hexdigest()[:8], 16)


def feasibility(cfg: EnvConfig, n: int, seed: int) -> dict[str, Any]:
    """Dry-run the generator on `n` instances.

    Returns `{"ok", "problems", "warnings", "asked", "produced", "stats", "seconds"}`. A problem (reject):
    the generator raised, served fewer than `SHORTFALL` of the instances overall, or of a size asked for
    at least 4. A warning (kept, shown to the engineer through the env statistics): a wait-share shortfall.
    """
    t0 = time.monotonic()
    cfg = cfg.model_copy(update={"num_instances": n})  # cfg is checked; only the count changes
    try:
        gen = generate(cfg, n, seed, num_agents=cfg.num_agents, workers=1)
    except Exception as e:  # any generator failure is a reason to reject, never a crash of the run
        return {
            "ok": False,
            "problems": [f"the generator failed: {type(e).__name__}: {e}"[:500]],
            "warnings": [],
            "seconds": round(time.monotonic() - t0, 3),
        }
    problems: list[str] = []
    warnings: list[str] = []
    produced = len(gen.instances)
    if produced < SHORTFALL * n:
        problems.append(f"the generator served only {produced} of {n} instances")
    per_size = (gen.stats or {}).get("sizes") or {}
    for s, row in sorted(per_size.items(), key=lambda kv: int(kv[0])):
        asked, got = int(row.get("asked") or 0), int(row.get("produced") or 0)
        if asked >= 4 and got < SHORTFALL * asked:
            problems.append(f"size {s}: the generator served {got} of {asked} asked instances")
        if row.get("wait_shortfall"):
            warnings.append(
                f"size {s}: {row['wait_shortfall']} of {row.get('asked_wait_count', '?')} instances asked to need "
                f"a wait do not (wait_ratio {row.get('asked_wait_ratio')})"
            )
    return {
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "asked": n,
        "produced": produced,
        "stats": gen.stats,
        "seconds": round(time.monotonic() - t0, 3),
    }


def check_proposal(
    proposal: dict | None, current: dict, parse_errors: list[str] | None = None
) -> dict[str, Any]:
    """Steps 1-3 (no generator): `{"config": EnvConfig|None, "decision": "accepted"|"projected"|None,
    "errors": [...], "notes": [...]}`; `config` None means unusable."""
    notes: list[str] = []
    if proposal is None:
        return {
            "config": None,
            "decision": None,
            "errors": list(parse_errors or ["no usable JSON object in the reply"]),
            "notes": notes,
        }
    if not isinstance(proposal, dict):
        return {
            "config": None,
            "decision": None,
            "errors": [f"the proposal must be a JSON object, got {type(proposal).__name__}"],
            "notes": notes,
        }
    for key in proposal:
        if key != "sizes":
            notes.append(f"{key}: dropped (the engineer sets only 'sizes')")
    candidate = {  # `current` is the dump of a checked config (apply's): its run-level fields are kept
        "sizes": proposal.get("sizes"),
        "num_agents": current["num_agents"],
        "num_instances": current["num_instances"],
    }
    try:
        return {
            "config": EnvConfig.model_validate(candidate),
            "decision": "accepted",
            "errors": [],
            "notes": notes,
        }
    except ValidationError as e:
        try:
            strict_error = format_validation_error(e)
        except _CHECK_ERRORS:
            strict_error = f"the proposal failed strict validation ({e.error_count()} error(s))"
    except _CHECK_ERRORS as e:
        strict_error = f"the proposal failed strict validation: {type(e).__name__}: {e}"
    try:
        cfg, proj_notes = project(candidate)
    except (*_CHECK_ERRORS, ValidationError) as e:
        return {
            "config": None,
            "decision": None,
            "errors": [strict_error[:1500], f"cannot project it: {type(e).__name__}: {e}"[:500]],
            "notes": notes,
        }
    return {
        "config": cfg,
        "decision": "projected",
        "errors": [strict_error[:1500]],
        "notes": notes + proj_notes,
    }


def validate_config(state: LoopState, runtime: Runtime[RunContext]) -> dict[str, Any]:
    """Node: check the engineer's proposal as its family's answer format asks (`VALIDATORS`, by the run's
    `LoopFamily.answer_key`): MAPF-FrozenLake's strict check, projection and feasibility (`validate_sizes`), or a
    family's level shares (`validate_task`).

    Reads state: stage, config (current), proposal, feedback (extraction errors when proposal is None),
    attempts, rationale. Returns: accepted (the config dump, or None on "retry"), decision, feedback (errors
    for the engineer; [] when accepted), attempts, log.
    """
    settings, run_dir = runtime.context.settings, runtime.context.run_dir
    return VALIDATORS[family_of(settings).answer_key](state, settings, run_dir)


def validate_sizes(state: dict, settings: Settings, run_dir: Path) -> dict[str, Any]:
    """MAPF-FrozenLake's validation: strict check, projection, feasibility (see the module docstring)."""
    stage = int(state.get("stage") or 0)
    attempts = int(state.get("attempts") or 1)
    max_attempts = settings.engineer_max_attempts
    current = state["config"]
    proposal = state.get("proposal")
    parse_errors = list(state.get("feedback") or []) if proposal is None else None

    checked = check_proposal(proposal, current, parse_errors)
    cfg: EnvConfig | None = checked["config"]
    errors: list[str] = list(checked["errors"])
    feas: dict[str, Any] | None = None
    if cfg is not None:
        feas = feasibility(cfg, settings.feasibility_n, _stage_seed(settings.seed, stage, attempts))
        if not feas["ok"]:
            errors += [f"infeasible: {p}" for p in feas["problems"]]
            cfg = None

    if cfg is not None:
        decision = checked["decision"]
        accepted = cfg.model_dump(mode="json")
        reason = (
            "the proposal passed strict validation"
            if decision == "accepted"
            else (
                f"the proposal failed strict validation and was projected ({len(checked['notes'])} change(s))"
            )
        )
        feedback: list[str] = []
    elif attempts < max_attempts:
        decision, accepted = "retry", None
        reason = f"unusable proposal (attempt {attempts} of {max_attempts}); errors sent back to the engineer"
        feedback = errors
    else:
        decision = "kept_previous"
        accepted = current
        reason = f"unusable proposal after {attempts} attempt(s); the current config is kept"
        feedback = errors

    record = {
        "attempt": attempts,
        "decision": decision,
        "reason": reason,
        "errors": errors,
        "notes": checked["notes"],
        "proposal": stored_proposal(proposal),
        "rationale": state.get("rationale", ""),
        "reply": state.get("reply"),  # an empty or cut reply, named (propose_config)
        "diff": config_diff(current, accepted) if accepted is not None else {},
        "feasibility": _brief(feas),
        "accepted": accepted,
    }
    _append_record(stage_dir(run_dir, stage) / "validation.json", stage, record)
    moved = len(record["diff"])
    return {
        "accepted": accepted,
        "decision": decision,
        "feedback": feedback,
        "attempts": attempts,
        "log": [
            f"stage {stage}: validation attempt {attempts}: {decision} ({moved} size(s) changed)"
            + (f"; {errors[0][:160]}" if errors else "")
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
    except _CHECK_ERRORS as e:
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


def validate_task(state: dict, settings: Settings, run_dir: Path) -> dict[str, Any]:
    """A level-share family's validation (`nodes/task_loop.py`): accepted as proposed, else a retry with the error
    while attempts remain, else the nearest valid config (projected), else the current config kept. Each attempt is
    a record in stage_<k>/validation.json, as MAPF's."""
    task = family_of(settings).task
    stage = int(state.get("stage") or 0)
    n = settings.train.instances_per_stage
    attempts = int(state.get("attempts") or 1)
    current = dict(state.get("config") or {})
    proposal = state.get("proposal")
    errors = list(state.get("feedback") or []) if proposal is None else []
    accepted, found = check(task, proposal, n) if proposal is not None else (None, [])
    errors += found
    if accepted is not None:
        decision, reason = "accepted", "the proposal passed strict validation"
    elif attempts < settings.engineer_max_attempts:
        decision, reason = "retry", f"unusable proposal (attempt {attempts} of {settings.engineer_max_attempts})"
    else:
        decision, reason = "kept_previous", f"unusable proposal after {attempts} attempt(s); the current config is kept"
        if isinstance(proposal, dict):
            try:
                accepted = project_levels(task, proposal, n)
                decision, reason = "projected", "the proposal failed strict validation and was projected"
            except ValueError:
                accepted = None
        if accepted is None:
            accepted = current
    record = {"attempt": attempts, "decision": decision, "reason": reason, "errors": errors, "notes": [],
              "proposal": stored_proposal(proposal), "rationale": state.get("rationale", ""),
              "reply": state.get("reply"),
              "diff": levels_diff(current, accepted) if decision != "retry" else {}, "feasibility": None,
              "accepted": accepted if decision != "retry" else None}
    _append_record(stage_dir(run_dir, stage) / "validation.json", stage, record)
    return {"accepted": accepted if decision != "retry" else None, "decision": decision,
            "feedback": errors if decision != "accepted" else [], "attempts": attempts,
            "log": [f"stage {stage}: validation attempt {attempts}: {decision} ({len(record['diff'])} level(s) changed)"
                    + (f"; {errors[0][:160]}" if errors else "")]}


# How a proposal is checked, by the family's answer format (`LoopFamily.answer_key`); both write the same
# validation.json records (`_append_record`).
VALIDATORS = {"sizes": validate_sizes, "levels": validate_task}
