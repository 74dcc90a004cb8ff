"""A family whose levers are not level shares, in one module and one registration line: the engineer sets a scalar
`difficulty` in [0, 1] and a `stage_size` (how many items a stage trains on). `ScalarTask` is the trainer's task
(adding two numbers, 1-3 digits a term); `ScalarFamily` is its `families.base.LoopFamily`; the one line that
registers it is `loop_family = ScalarFamily` in the task's class (docs/tasks.md, worked example 2).

The tests run it through apply -> train_stage (one tiny GRPO step) -> evaluate -> summarize_failures -> a scripted
engineer -> validate_config, `--approve` with an edit, and `--dry-run`, with nothing of the project edited for it.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from families.base import table_cell
from families.metrics import compute_metrics
from families.policy import Checked
from families.reply import Extracted, Shape, read_reply
from trainer.files import write_text_atomic
from trainer.task import Verdict

TASK = "tests.test_family_shape:ScalarTask"
DIGITS = (1, 2, 3)
MIN_SIZE, MAX_SIZE = 4, 32


# ----------------------------------------------------------------------------- the family's config


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    difficulty: float = Field(ge=0.0, le=1.0, strict=True, description="0: 1-digit terms only; 1: 3-digit terms only")
    stage_size: int = Field(ge=MIN_SIZE, le=MAX_SIZE, strict=True, description="items a stage trains on")


class ScalarConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    knobs: Knobs
    num_instances: int = 8


def _digits(difficulty: float, rng: random.Random) -> int:
    """An item's digits a term: 1 plus two draws that each add one with probability `difficulty`."""
    return 1 + (rng.random() < difficulty) + (rng.random() < difficulty)


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})"
    return str(e).splitlines()[0]


# ----------------------------------------------------------------------------- the family


class ScalarFamily:
    """Adding numbers with a scalar difficulty and a stage size as the engineer's levers."""

    item_word = "items"
    shape = Shape("knobs", frozenset({"difficulty", "stage_size"}), "knob")

    def __init__(self, task: Any, task_name: str):
        self.task, self.task_name, self.name = task, task_name, task.name

    # the engineer
    def context(self, state: dict, settings: Any, eval_rows: list[dict], env_stats: dict | None) -> str:
        m = state.get("metrics") or {}
        rows = "\n".join(f"| {d} | {(m.get('by_level') or {}).get(str(d), {}).get('valid_rate', '-')} |"
                         for d in DIGITS)
        knobs = (state.get("config") or {}).get("knobs") or {}
        return (f"# Evidence after training stage {state.get('stage', 0)} ({self.name})\n\n"
                f"Valid rate {m.get('eval/valid_rate')} over {m.get('eval/n', 0)} questions.\n\n"
                f"| digits | valid rate |\n|---|---|\n{rows}\n\nCurrent knobs: {json.dumps(knobs)}\n")

    def system_prompt(self, settings: Any) -> str:
        return ("You choose the next training stage of a policy that adds numbers: `difficulty` in [0, 1] (0: "
                f"1-digit terms, 1: 3-digit terms) and `stage_size` ({MIN_SIZE}-{MAX_SIZE} items). Reply with ONE "
                'JSON object: {"knobs": {"difficulty": ..., "stage_size": ...}, "rationale": "..."}.')

    def answer_schema(self) -> dict:
        return {"type": "object", "required": ["knobs"], "additionalProperties": False,
                "properties": {"knobs": Knobs.model_json_schema(), "rationale": {"type": "string"}}}

    def read_reply(self, text: str, finish_reason: str | None, parsed: Any) -> Extracted:
        return read_reply(text, self.shape, finish_reason, parsed)

    def check(self, proposal: Any, current: dict, settings: Any, *, seed: int, repair: bool) -> Checked:
        """Strict check; with `repair`, the projection: difficulty clipped to [0, 1], stage size rounded and clipped."""
        n = settings.train.instances_per_stage
        try:
            return Checked(ScalarConfig.model_validate({**proposal, "num_instances": n}).model_dump(), "accepted")
        except (ValidationError, TypeError) as e:
            error = _first_line(e)
        if not repair:
            return Checked(None, errors=[error])
        try:
            knobs = proposal["knobs"]
            d, size = float(knobs["difficulty"]), float(knobs["stage_size"])
            if not (math.isfinite(d) and math.isfinite(size)):
                raise ValueError("not finite")
        except (TypeError, KeyError, ValueError) as e:
            return Checked(None, errors=[error, f"cannot project it: {type(e).__name__}: {e}"])
        fixed = {"difficulty": min(1.0, max(0.0, d)), "stage_size": int(min(MAX_SIZE, max(MIN_SIZE, round(size))))}
        notes = [f"knobs.{k}: {knobs[k]!r} -> {fixed[k]}" for k in fixed if knobs[k] != fixed[k]]
        return Checked({"knobs": fixed, "num_instances": n}, "projected", [error], notes)

    def diff(self, old: dict | None, new: dict | None) -> dict:
        a, b = (old or {}).get("knobs") or {}, (new or {}).get("knobs") or {}
        moved = {k: {"from": a.get(k), "to": b.get(k)} for k in ("difficulty", "stage_size") if a.get(k) != b.get(k)}
        return {"knobs": moved} if moved else {}

    def table(self, old: dict | None, new: dict) -> str:
        a, b = (old or {}).get("knobs") or {}, (new or {}).get("knobs") or {}
        rows = ["knob        value", "-" * 30]
        for k in ("difficulty", "stage_size"):
            cell = table_cell(a.get(k), b.get(k))
            rows.append(f"{k:<12}{cell}" + (" *" if "->" in cell else ""))
        return "\n".join(rows)

    def classic(self, name: str, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]:
        knobs = dict(config.get("knobs") or {})
        p = {d: float((by_level.get(str(d)) or {}).get("valid_rate", 0.0)) for d in DIGITS}
        if name == "fixed":
            return {"knobs": knobs}, "fixed: keep the stage-0 knobs", memory
        if name == "random":
            return {"knobs": {"difficulty": round(rng.random(), 3), "stage_size": rng.randint(MIN_SIZE, MAX_SIZE)}}, \
                "random", memory
        if name == "learnability":
            best = max(DIGITS, key=lambda d: p[d] * (1 - p[d]))
            return {"knobs": {**knobs, "difficulty": (best - 1) / 2}}, f"learnability: most signal at {best} digits", memory
        if name == "threshold":
            level = 1 + round(2 * knobs.get("difficulty", 0.0))
            up = p.get(level, 0.0) >= 0.7
            return {"knobs": {**knobs, "difficulty": min(1.0, knobs.get("difficulty", 0.0) + 0.25 * up)}}, \
                f"threshold: {'harder' if up else 'unchanged'}", memory
        raise ValueError(f"classic engineer {name!r}: allowed: fixed, random, learnability, threshold")

    # the stage's data
    def first_config(self, given: dict | None, seed: int, n: int) -> ScalarConfig:
        if given:
            return ScalarConfig.model_validate({**given, "num_instances": n})
        rng = random.Random(seed)
        return ScalarConfig(knobs=Knobs(difficulty=round(rng.random(), 3), stage_size=8), num_instances=n)

    def next_config(self, accepted: dict, n: int) -> ScalarConfig:
        return ScalarConfig.model_validate({**accepted, "num_instances": n})

    def trained_config(self, cfg: ScalarConfig, n: int, max_train_size: int | None) -> tuple[ScalarConfig, None]:
        return cfg, None

    def stage_items(self, cfg: ScalarConfig, n: int, seed: int, path: Path) -> tuple[int, dict[str, Any]]:
        """The stage trains on `stage_size` items (the lever), whatever the run's instances per stage."""
        rng = random.Random(seed)
        items = [self.task.item(f"s{seed}-{i}", _digits(cfg.knobs.difficulty, rng), rng)
                 for i in range(cfg.knobs.stage_size)]
        write_text_atomic(path, "".join(self.task.item_to_json(i) + "\n" for i in items))
        return len(items), {"by_digits": {str(d): sum(i["digits"] == d for i in items) for d in DIGITS}}

    # evaluation
    def split(self, name: str) -> list:
        if name not in self.task.split_names:
            raise ValueError(f"split {name!r}: allowed: val, test")
        rng = random.Random(name)
        return [self.task.item(f"{name}-{d}-{i}", d, rng) for d in DIGITS for i in range(2)]

    def verdict_row(self, item: Any, text: str, completion_tokens: int | None, finish_reason: str | None,
                    criterion: str) -> dict[str, Any]:
        v = self.task.verify(item, text)
        return {"id": item["id"], "level": item["digits"], "tags": {}, "text": text,
                "completion_tokens": completion_tokens, "finish_reason": finish_reason, "valid": v.valid,
                "optimal": v.optimal, "failure": v.label, "score": v.score}

    def metrics(self, rows, prefix: str = "eval") -> dict[str, Any]:
        return compute_metrics(rows, prefix, self.task.failure_labels)

    def final(self, rows) -> tuple[dict[str, Any], str]:
        final = self.metrics(rows, prefix="final")
        return final, f"valid {final['final/valid_rate']:.3f} over {final['final/n']}\n"

    def eval_key_fields(self) -> dict[str, Any]:
        return {"task": self.task_name}

    def report_levels(self) -> list[dict[str, Any]]:
        return [{"index": d, "label": f"{d}-digit terms", "column": f"L{d}"} for d in DIGITS]

    # the run's settings
    def settings_defaults(self) -> dict[str, Any]:
        return {"eval_split": "val", "final_split": "test", "final_cpu_split": None}

    def check_settings(self, settings: Any) -> None:
        for field in ("eval_split", "final_split"):
            if getattr(settings, field) not in self.task.split_names:
                raise ValueError(f"{field}={getattr(settings, field)!r} is not a split of task {settings.task}; "
                                 "allowed: val, test")


# ----------------------------------------------------------------------------- the task (the trainer's protocol)


class ScalarTask:
    name = "toy-scalar"
    failure_labels = ("no_answer", "wrong")
    split_names = ("val", "test")
    level_order = (1, 2, 3)  # its levels, the digits of a term: what a warm start draws from (trainer.task.task_levels)
    loop_family = ScalarFamily  # the one line that registers the family

    def item(self, item_id: str, digits: int, rng: random.Random) -> dict:
        lo, hi = 10 ** (digits - 1), 10**digits
        return {"id": item_id, "digits": digits, "a": rng.randrange(lo, hi), "b": rng.randrange(lo, hi)}

    def item_to_json(self, item: dict) -> str:
        return json.dumps(item, sort_keys=True)

    def item_from_json(self, text: str) -> dict:
        return json.loads(text)

    def item_id(self, item: dict) -> str:
        return item["id"]

    def level(self, item: dict) -> int:
        return int(item["digits"])

    def prompt(self, item: dict, style: str) -> list[dict]:
        return [{"role": "user", "content": f"What is {item['a']} + {item['b']}? Answer with the number only."}]

    def gold(self, item: dict) -> str:
        return str(item["a"] + item["b"])

    def warm_start_items(self, levels: list[int], n: int, seed: int) -> list[dict]:
        rng = random.Random(seed + 1_000_003)
        return [self.item(f"w{seed}-{i}", min(3, max(1, levels[i % len(levels)])), rng) for i in range(n)]

    def verify(self, item: dict, answer: str) -> Verdict:
        found = re.findall(r"-?\d+", answer or "")
        if not found:
            return Verdict(valid=False, label="no_answer", score=0.0)
        ok = int(found[-1]) == item["a"] + item["b"]
        return Verdict(valid=ok, label=None if ok else "wrong", score=float(ok), optimal=ok)


# ----------------------------------------------------------------------------- the tests


def _settings(**over):
    from graph.settings import build_settings

    cli = {"task": TASK, "preset": "smoke", "engineer": "fixed", "eval_limit": None, "final_limit": None,
           "engineer_max_attempts": 2, **over}
    return build_settings(cli, env={})


def test_the_family_is_picked_by_its_one_registration_line_and_has_every_member():
    from families import LoopFamily, family_of

    family = family_of(_settings())
    assert (type(family).__module__, type(family).__name__, family.task.name) == (
        "tests.test_family_shape", "ScalarFamily", "toy-scalar")
    members = set(LoopFamily.__annotations__) | {m for m in vars(LoopFamily) if not m.startswith("_")}
    assert not [m for m in members if not hasattr(family, m)]


def test_validate_config_uses_the_one_policy_for_a_scalar_family(tmp_path):
    """Outside the legal space: sent back with the reason, then projected on the last attempt; the record's diff
    and the progress line are the family's."""
    from graph.progress import describe_update
    from nodes.validate_config import validate_config
    from tests.support.node_helpers import runtime

    settings = _settings()
    rt = runtime(settings, tmp_path / "run")
    current = {"knobs": {"difficulty": 0.2, "stage_size": 8}, "num_instances": 16}
    state = {"stage": 0, "config": current, "attempts": 1, "proposal": {"knobs": {"difficulty": 1.5, "stage_size": 8}}}
    update = validate_config(state, rt)
    assert update["decision"] == "retry" and "difficulty" in update["feedback"][0]
    update = validate_config({**state, "attempts": 2}, rt)
    assert update["decision"] == "projected" and update["accepted"]["knobs"] == {"difficulty": 1.0, "stage_size": 8}
    record = json.loads((tmp_path / "run" / "stage_0" / "validation.json").read_text())["decisions"][-1]
    assert record["diff"] == {"knobs": {"difficulty": {"from": 0.2, "to": 1.0}}}
    assert record["notes"] == ["knobs.difficulty: 1.5 -> 1.0"]
    line = describe_update("validate_config", update, {**state, **update}, settings)
    assert line == "[stage 0] engineer proposal: projected (knobs difficulty .20->1.00)", line


def test_approve_with_an_edit(tmp_path):
    from graph import approve

    settings = _settings()
    run_dir = tmp_path / "run"
    (run_dir / "stage_0").mkdir(parents=True)
    current = {"knobs": {"difficulty": 0.2, "stage_size": 8}, "num_instances": 16}
    proposed = {"knobs": {"difficulty": 0.5, "stage_size": 8}, "num_instances": 16}
    values = {"stage": 0, "config": current, "accepted": proposed, "decision": "accepted", "attempts": 1}
    update, lines = approve.decide({"knobs": {"difficulty": 0.75, "stage_size": 40}}, values, settings, run_dir)
    assert update == {"accepted": {"knobs": {"difficulty": 0.75, "stage_size": 32}, "num_instances": 16},
                      "decision": "edited (person)"}
    assert lines[0] == "the edit was projected onto allowed values: knobs.stage_size: 40 -> 32"
    assert lines[2].splitlines()[2].split() == ["difficulty", "0.200", "->", "0.750", "*"]
    person = json.loads((run_dir / "stage_0" / "validation.json").read_text())["decisions"][-1]
    assert person["by"] == "person" and person["diff"]["knobs"]["stage_size"] == {"from": 8, "to": 32}
    update, lines = approve.decide({"knobs": {"difficulty": "hard"}}, values, settings, run_dir)
    assert update is None and lines[0].startswith("cannot use the edit: knobs.difficulty")


def test_dry_run(tmp_path, capsys):
    """`--dry-run` builds the training plan, generates stage 0's data and checks one proposal, all through the
    family (about 20 s: the training plan)."""
    from graph.dryrun import dry_run

    dry_run(tmp_path / "dry", _settings())
    err = capsys.readouterr().err
    assert "[dry-run] stage-0 data generated" in err
    assert "[dry-run] engineer 'fixed' answered" in err and "a config, accepted (no change)" in err
    assert "difficulty" in err and "knob        value" in err  # the family's own table


@pytest.mark.slow
def test_a_scalar_family_runs_apply_train_evaluate_summarize_propose_validate(embedded_model_path, tmp_path,
                                                                              monkeypatch):
    from nodes.apply import apply
    from nodes.evaluate import evaluate
    from nodes.propose_config import propose_config
    from nodes.summarize_failures import summarize_failures
    from nodes.train_stage import train_stage
    from nodes.validate_config import validate_config
    from tests.support.node_helpers import ScriptedChat, runtime
    from tests.support.tiny_llama import save_tiny_llama

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    base = save_tiny_llama(tmp_path / "base", embedded_model_path)
    settings = _settings(engineer="self", policy_model=str(base), policy_backend="transformers", eval_max_tokens=8,
                         **{"train.max_steps": 1, "train.max_completion_length": 8, "train.train_layers": 0,
                            "train.instances_per_stage": 8, "train.prompt_style": "compact"})
    run = tmp_path / "run"
    rt = runtime(settings, run)
    state: dict = {"config": {"knobs": {"difficulty": 0.0, "stage_size": 6}}}

    state.update(apply(state, rt))
    items = [json.loads(x) for x in (run / "stage_0" / "train.jsonl").read_text().splitlines()]
    assert len(items) == 6 and {i["digits"] for i in items} == {1}  # the stage size and difficulty are the levers

    state.update(train_stage(state, rt))
    meta = json.loads((run / "stage_0" / "checkpoint" / "trainer_meta.json").read_text())
    assert meta["task"] == "toy-scalar" and state["train_metrics"]["train/steps"] == 1

    state.update(evaluate(state, rt))
    rows = [json.loads(x) for x in (run / "stage_0" / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 6 == state["metrics"]["eval/n"] and {r["level"] for r in rows} == set(DIGITS)

    state.update(summarize_failures(state, rt))
    assert "| digits | valid rate |" in state["context"] and '"stage_size": 6' in state["context"]

    engineer = ScriptedChat(['{"difficulty": 2, "stage_size": 10}',
                             '{"knobs": {"difficulty": 1.0, "stage_size": 10}, "rationale": "harder"}'])
    state.update(propose_config(state, rt, model=engineer))
    assert state["proposal"] == {"knobs": {"difficulty": 2, "stage_size": 10}}  # a bare object, wrapped
    state.update(validate_config(state, rt))
    assert state["decision"] == "retry" and "difficulty" in state["feedback"][0]
    state.update(propose_config(state, rt, model=engineer))
    assert "difficulty" in engineer.calls[-1][0][1]["content"]  # the error went back to the engineer
    state.update(validate_config(state, rt))
    assert state["decision"] == "accepted" and state["accepted"]["knobs"] == {"difficulty": 1.0, "stage_size": 10}

    state.update(apply(state, rt))
    items = [json.loads(x) for x in (run / "stage_1" / "train.jsonl").read_text().splitlines()]
    assert state["stage"] == 1 and len(items) == 10 and {i["digits"] for i in items} == {3}


def test_docs_tasks_md_walks_through_both_worked_examples_the_tests_run():
    """docs/tasks.md's two worked examples are the files these tests run: the level-share task (one file, every
    member it lists is one the family checks) and this module, registered by the line the doc quotes."""
    from families.level_share import LEVEL_SHARE_MEMBERS

    text = (Path(__file__).resolve().parents[1] / "docs" / "tasks.md").read_text()
    assert "`tests/support/toy_task.py`" in text and "`tests/test_family_shape.py`" in text
    assert "`loop_family = ScalarFamily`" in text and ScalarTask.loop_family is ScalarFamily
    missing = [m for m in LEVEL_SHARE_MEMBERS if f"`{m}" not in text]
    assert not missing, f"docs/tasks.md does not list the level-share members {missing}"
