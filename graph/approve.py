"""`--approve`: the run pauses before each `apply` (graph.loop) and a person answers for the validated
proposal. Their edit goes through the family's one check (`LoopFamily.check`, as validate_config checks a last
attempt), and every answer is written to stage_k/validation.json by validate_config's own writer
(`nodes.validate_config.record_person`).

What the person edits and reads is the family's: the key it sets (`LoopFamily.shape`: MAPF-FrozenLake's per-size
knobs `{"sizes": ...}`, a level-share task's `{"levels": ...}`) and the old -> new table (`LoopFamily.table`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from families import family_of
from families.policy import Checked
from graph.progress import RunError, diff_summary, say
from graph.settings import Settings
from trainer.files import stage_dir, write_json_atomic

APPROVE_PROMPT = "apply it? [y] yes / [n] no, keep the current config / [e] edit it in $EDITOR: "


def _editor_command() -> list[str]:
    import shlex

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or ""
    cmd = shlex.split(editor)
    if not cmd:
        raise ValueError("no editor: set EDITOR (e.g. EDITOR=nano) before the run, or answer y or n")
    return cmd


def _lever(settings: Settings) -> str:
    """The key of what the engineer (and the person) sets: the family's (`LoopFamily.shape`), `sizes` or `levels`."""
    return family_of(settings).shape.key


def _diff(current: dict[str, Any] | None, new: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """validation.json's `diff`, as validate_config records it for the run's family (`LoopFamily.diff`)."""
    return family_of(settings).diff(current, new)


def _table(current: dict[str, Any] | None, new: dict[str, Any], settings: Settings) -> str:
    """The proposal as the family draws it for a person (`LoopFamily.table`): old -> new per size and knob, or
    per level."""
    return family_of(settings).table(current, new)


def _check_edit(answer: Any, current: dict[str, Any], settings: Settings, stage: int) -> Checked:
    """An edited config through the family's one check, as validate_config checks a last attempt (a person's edit
    is not sent back: it is repaired where it can be), its feasibility dry-run on the next stage's data seed.
    An unusable edit has `config` None and one error line."""
    from nodes.apply import stage_seed

    if not isinstance(answer, dict):
        return Checked(None, errors=["cannot use the edit: no usable JSON object in the reply"])
    checked = family_of(settings).check(answer, current, settings, seed=stage_seed(settings.seed, stage + 1),
                                        repair=True)
    if checked.config is None:
        checked.errors = [f"cannot use the edit: {'; '.join(checked.errors)}".splitlines()[0][:500]]
    return checked


def _edit_in_editor(path: Path, config: dict[str, Any], key: str = "sizes") -> Any:
    """Write `config`'s `key` (what the engineer sets) to `path`, open $VISUAL/$EDITOR on it, and return the JSON
    it holds afterwards (raises ValueError with one line when it is not JSON or the editor failed)."""
    import subprocess

    write_json_atomic(path, {key: config.get(key, config)})
    cmd = _editor_command()
    try:
        rc = subprocess.run([*cmd, str(path)]).returncode
    except OSError as e:
        raise ValueError(f"cannot start the editor {cmd[0]!r}: {e.strerror or e}") from None
    if rc != 0:
        raise ValueError(f"the editor {cmd[0]!r} exited with status {rc}; nothing was changed")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not JSON any more: {str(e).splitlines()[0]}") from None


def decide(answer: Any, values: dict[str, Any], settings: Settings, run_dir: Path,
           source: str | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """A person's answer to the validated proposal: `y`, `n`, or an edited config (a dict, or its JSON text)
    that goes through validate_config's own checks (strict validation, else projection, then the generator's
    feasibility dry-run on the next stage's data seed; another task's own strict check, else its projection).
    A usable answer is recorded in stage_k/validation.json (`record_person`, `by: person`) and gives (the state
    update, the lines that say what will be applied); an unusable one gives (None, [why]) and records nothing.
    `--approve` and a LangGraph interrupt both answer through here."""
    from nodes.validate_config import record_person

    accepted, current = values["accepted"], values["config"]
    stage = int(values.get("stage", 0))
    attempts = int(values.get("attempts") or 1)  # the engineer's; the person's answer is numbered after them
    if isinstance(answer, str):
        word = answer.strip().lower()
        if word in ("y", "yes"):
            record_person(run_dir, stage, attempts, {
                "decision": "approved (person)", "accepted": accepted,
                "reason": f"a person approved the engineer's {values.get('decision')} config",
                "diff": _diff(current, accepted, settings)})
            return {}, [f"[approve] applying the engineer's config to stage {stage + 1}: "
                        f"{diff_summary(_diff(current, accepted, settings))}"]
        if word in ("n", "no"):
            record_person(run_dir, stage, attempts, {"decision": "kept_previous (person)", "accepted": current,
                                                     "reason": "a person kept the current config", "diff": {}})
            return ({"accepted": current, "decision": "kept_previous (person)"},
                    [f"[approve] keeping stage {stage}'s config for stage {stage + 1} (no change)"])
        try:
            answer = json.loads(answer)
        except ValueError:
            return None, [f"please answer y, n or an edited config (got {answer.strip()[:40]!r})"
                          if answer.strip() else "please answer y, n or an edited config"]
    checked = _check_edit(answer, current, settings, stage)
    if checked.config is None:
        return None, checked.errors
    lines = []
    if checked.how in ("projected", "normalised"):
        lines.append(f"the edit was {checked.how} onto allowed values: {'; '.join(checked.notes)}"[:500])
    edited, feas = checked.config, checked.feasibility
    record_person(run_dir, stage, attempts, {
        "decision": "edited (person)", "accepted": edited, **({"source": source} if source else {}),
        "reason": f"a person replaced the engineer's config ({checked.how} by validation)",
        "errors": checked.errors, "notes": checked.notes, "diff": _diff(current, edited, settings),
        "feasibility": None if feas is None else {k: v for k, v in feas.items() if k != "stats"},
    })
    lines += [f"[approve] applying the edited config to stage {stage + 1} ({checked.how} by validation):",
              _table(current, edited, settings)]
    return {"accepted": edited, "decision": "edited (person)"}, lines


def ask_approval(graph, cfg: dict[str, Any], settings: Settings, run_dir: Path) -> None:
    """Interrupted before apply: let a person apply, reject or edit the validated proposal.

    The proposal is shown as a table (old -> new per size and knob); the answer is explicit: `y` applies
    it, `n` keeps the current config, `e` opens $VISUAL/$EDITOR on a prefilled file
    (stage_k/approve_edit.json). An edited config goes through validate_config's own checks (`decide`); an
    unusable edit is explained and asked about again. Anything else (Enter alone included) is asked
    again. Every answer is recorded in stage_k/validation.json as a decision `by: person`, and the line
    after it says what will be applied."""
    snap = graph.get_state(cfg)
    values = snap.values
    if not values.get("accepted") or "config" not in values:
        return  # stage 0: nothing proposed yet
    accepted, current = values["accepted"], values["config"]
    stage = int(values.get("stage", 0))
    say(f"\nProposed config for stage {stage + 1} (decision: {values.get('decision')}; * = changed):")
    say(_table(current, accepted, settings))
    if values.get("rationale"):
        say(f"rationale: {values['rationale'][:1000]}")
    edit_path = stage_dir(run_dir, stage) / "approve_edit.json"
    draft = accepted
    while True:
        say(APPROVE_PROMPT)
        line = sys.stdin.readline()
        if not line:
            raise RunError("--approve needs answers on standard input; none came (end of input)")
        answer = line.strip().lower()
        if answer in ("y", "yes", "n", "no"):
            update, lines = decide(answer, values, settings, run_dir)
        elif answer not in ("e", "edit"):
            say(f"please answer y, n or e (got {answer[:40]!r})" if answer else "please answer y, n or e")
            continue
        else:
            try:
                raw = _edit_in_editor(edit_path, draft, _lever(settings))
            except ValueError as e:
                say(f"cannot use the edit: {e}"[:500])
                continue
            if isinstance(raw, dict) and isinstance(raw.get(_lever(settings)), dict):
                draft = raw  # a second [e] reopens the person's own last edit
            update, lines = decide(raw if isinstance(raw, dict) else [], values, settings, run_dir,
                                   source=str(edit_path))
        for text in lines:
            say(text)
        if update is None:
            continue
        if update:
            graph.update_state(cfg, update)
        return


def interrupt_for_approval(state: dict[str, Any], settings: Settings, run_dir: Path) -> dict[str, Any]:
    """`approve` on the LangGraph server (Studio, the SDK): before apply, the run pauses in a LangGraph
    interrupt whose value shows the proposal; the value it is resumed with (`Command(resume=...)`) is the
    person's decision, as at the `--approve` prompt: "y", "n" or an edited config ({"sizes": ...}; another
    task's {"levels": ...}). An unusable answer pauses again, its reason in the interrupt's `error`. Returns the
    state update (`accepted`, `decision`) apply then runs with; recorded in validation.json as `--approve`
    records it."""
    from langgraph.types import interrupt

    accepted, current = state["accepted"], state["config"]
    stage = int(state.get("stage", 0))
    payload: dict[str, Any] = {
        "question": f"apply the proposed config to stage {stage + 1}? resume with \"y\" (apply it), \"n\" (keep "
                    f"stage {stage}'s config) or an edited config {{\"{_lever(settings)}\": ...}}",
        "stage": stage + 1, "decision": state.get("decision"), "rationale": state.get("rationale"),
        "diff": _diff(current, accepted, settings), "table": _table(current, accepted, settings),
        "proposed": accepted, "current": current,
    }
    while True:
        update, lines = decide(interrupt(payload), state, settings, run_dir)
        if update is not None:
            for text in lines:
                say(text)
            return update
        payload = {**payload, "error": lines[0]}
