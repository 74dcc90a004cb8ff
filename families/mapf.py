"""MAPF-FrozenLake's family: `MapfFamily`, its `families/base.py` `LoopFamily`.

Every member wraps what MAPF-FrozenLake's loop has always run: the paper's context modules
(`families/evidence.py`), its engineer prompt (`prompts/engineer_system.md`) and per-size config schema
(`env.EnvConfig`), the classic curricula over per-size knobs (`families/mapf_curricula.py`), a stage's data from
`env.generate` (sizes above `train.max_train_size` moved onto smaller ones, `env.restrict_sizes`), the fixed
benchmark splits (`env.load_split`), one verdict row per answer (`env.verify`) and the paper's final tables
(`families/metrics.py`). Its engineer answers `{"sizes": ...}`; `check` is the strict check (`EnvConfig`), the
rounding repair of the data ratios, the paper's projection (`env.project`) and the generator's feasibility
dry-run, under the one policy of `families/policy.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from env import (
    SIZES,
    EnvConfig,
    SizeKnobs,
    generate,
    load_split,
    project,
    random_config,
    restrict_sizes,
    verify,
)
from env.config import format_validation_error
from env.instance import write_jsonl
from families.base import Settings, number, table_cell
from families.evidence import build_context, fill, load_template
from families.mapf_curricula import CLASSIC
from families.metrics import compute_final_metrics, compute_metrics, final_table_md
from families.policy import Checked, rounded_shares
from families.reply import Extracted, Shape, read_reply
from families.views import MapfView
from trainer.task import Task, load_task

# ----------------------------------------------------------------------------- the engineer's prompt


def answer_schema() -> dict:
    """JSON schema of the whole answer: the engineer-editable config plus an optional `rationale`."""
    schema = EnvConfig.engineer_schema()
    schema = json.loads(json.dumps(schema))
    schema["properties"]["rationale"] = {"type": "string", "description": "what changed and why, briefly"}
    return schema


OPTIMAL_MEANS = {
    "makespan": "its makespan (the number of steps until the last agent is at its goal)",
    "soc": "its sum of costs (the steps of all agents, summed)",
}


def system_prompt(prompts_dir: Path | str | None = None, optimality: str = "makespan") -> str:
    """The engineer's system prompt: the task, the knobs, the answer contract and schema, and what "optimal"
    means in this run (`train.optimality`: makespan, the paper's criterion, or sum of costs)."""
    if optimality not in OPTIMAL_MEANS:
        raise ValueError(f"optimality {optimality!r}: allowed: {', '.join(OPTIMAL_MEANS)}")
    return fill(load_template("engineer_system.md", prompts_dir), optimal_means=OPTIMAL_MEANS[optimality]).strip()


# ----------------------------------------------------------------------------- stage data and verdicts


def checked_config(dump: dict[str, Any]) -> EnvConfig:
    """The EnvConfig of a dump validate_config already checked (`state["accepted"]`), rebuilt without
    checking it again."""
    sizes = {int(s): SizeKnobs.model_construct(**knobs) for s, knobs in dump["sizes"].items()}
    return EnvConfig.model_construct(sizes=sizes, num_agents=dump["num_agents"], num_instances=dump["num_instances"])


def instance_tags(inst: Any) -> dict[str, Any]:
    """The subset tags of an instance (`{"agents": 3, "wait": 0.25}` on test splits, else {})."""
    tags = getattr(inst, "tags", None)
    return dict(tags) if isinstance(tags, dict) else {}


def verdict_row(inst: Any, text: str, completion_tokens: int | None = None, finish_reason: str | None = None,
                criterion: str = "makespan"):
    """One `eval.jsonl` row: the instance's identity, the answer and its verdict (optimal by `criterion`)."""
    verdict = verify(inst, text, criterion)
    return {
        "id": inst.id,
        "level": inst.size,
        "num_agents": inst.num_agents,
        "tags": instance_tags(inst),
        "text": text,
        "completion_tokens": completion_tokens,
        "finish_reason": finish_reason,
        **verdict.model_dump(mode="json"),
        "optimal_soc": verdict.optimal_cost,
    }


# ----------------------------------------------------------------------------- checking a proposal

KNOBS = ("data_ratio", "hole_ratio", "wait_ratio")
KNOB_NAMES = {"data_ratio": "data", "hole_ratio": "hole", "wait_ratio": "wait"}
SHORTFALL = 0.5  # a size (or the whole draw) that gets less than this share of what it asked is infeasible
# Errors a malformed proposal can raise while it is checked (beyond pydantic's): a huge number
# (OverflowError is an ArithmeticError) or a deeply nested value (RecursionError).
CHECK_ERRORS = (TypeError, ValueError, ArithmeticError, RecursionError)


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


def _strict(candidate: dict) -> tuple[EnvConfig | None, str | None]:
    try:
        return EnvConfig.model_validate(candidate), None
    except ValidationError as e:
        try:
            return None, format_validation_error(e)
        except CHECK_ERRORS:
            return None, f"the proposal failed strict validation ({e.error_count()} error(s))"
    except CHECK_ERRORS as e:
        return None, f"the proposal failed strict validation: {type(e).__name__}: {e}"


def _normalised(candidate: dict) -> tuple[EnvConfig, str] | None:
    """The candidate with its data ratios rescaled, when that alone makes it valid (`families.policy.rounded_shares`)."""
    sizes = candidate.get("sizes")
    if not isinstance(sizes, dict) or not all(isinstance(k, dict) for k in sizes.values()):
        return None
    rounded = rounded_shares({s: knobs.get("data_ratio") for s, knobs in sizes.items()})
    if rounded is None:
        return None
    shares, note = rounded
    fixed = {**candidate, "sizes": {s: {**knobs, "data_ratio": shares[str(s)]} for s, knobs in sizes.items()}}
    cfg, _ = _strict(fixed)
    return None if cfg is None else (cfg, f"sizes.*.data_ratio: {note}")


def check(proposal: Any, current: dict, *, feasibility_n: int, seed: int, repair: bool) -> Checked:
    """MAPF-FrozenLake's check of a proposal against the current config (a checked dump: its run-level fields are
    kept, and any other top-level key than `sizes` is dropped with a note): strict validation (`accepted`), else
    data ratios off only by rounding rescaled (`normalised`), else with `repair` the paper's projection
    (`projected`, a note per change); then the generator's feasibility dry-run on `feasibility_n` instances from
    `seed`. A config that fails it, or no config, is None with the errors."""
    if not isinstance(proposal, dict):
        return Checked(None, errors=[f"the proposal must be a JSON object, got {type(proposal).__name__}"])
    notes = [f"{key}: dropped (the engineer sets only 'sizes')" for key in proposal if key != "sizes"]
    candidate = {"sizes": proposal.get("sizes"), "num_agents": current["num_agents"],
                 "num_instances": current["num_instances"]}
    cfg, strict_error = _strict(candidate)
    errors: list[str] = []
    how = "accepted"
    if cfg is None:
        errors = [strict_error[:1500]]
        rounded = _normalised(candidate)
        if rounded is not None:
            (cfg, note), how = rounded, "normalised"
            notes.append(note)
        elif not repair:
            return Checked(None, errors=errors, notes=notes)
        else:
            try:
                cfg, proj_notes = project(candidate)
            except (*CHECK_ERRORS, ValidationError) as e:
                return Checked(None, errors=[*errors, f"cannot project it: {type(e).__name__}: {e}"[:500]], notes=notes)
            how = "projected"
            notes += proj_notes
    feas = feasibility(cfg, feasibility_n, seed)
    if not feas["ok"]:
        return Checked(None, errors=[*errors, *(f"infeasible: {p}" for p in feas["problems"])], notes=notes,
                       feasibility=feas)
    return Checked(cfg.model_dump(mode="json"), how, errors, notes, feas)


def config_table(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """The proposal as one row per size, each knob `old -> new` (`=` when unchanged), for the terminal."""

    def knob(cfg: dict[str, Any] | None, size: str, name: str) -> float | None:
        sizes = (cfg or {}).get("sizes") or {}
        v = (sizes.get(size) or sizes.get(int(size)) or {}) if isinstance(sizes, dict) else {}
        return number(v.get(name) if isinstance(v, dict) else None)

    cell = table_cell
    sizes = sorted({str(k) for k in ((new or {}).get("sizes") or {})} | {str(k) for k in ((old or {}).get("sizes") or {})},
                   key=lambda x: (int(x), x) if x.isdigit() else (1 << 30, x))
    head = f"{'size':<6}" + "".join(f"{name:<17}" for name in KNOB_NAMES.values())
    rows = [head, "-" * len(head)]
    for n in sizes:
        cells = [cell(knob(old, n, k), knob(new, n, k)) for k in KNOB_NAMES]
        moved = any("->" in c for c in cells)
        rows.append(f"{n + 'x' + n:<6}" + "".join(f"{c:<17}" for c in cells) + (" *" if moved else ""))
    return "\n".join(rows)


# ----------------------------------------------------------------------------- the family


class MapfFamily:
    """MAPF-FrozenLake through the loop's protocol (`families/base.py` `LoopFamily`)."""

    name = "mapf"
    item_word = "instances"
    shape = Shape("sizes", frozenset(str(s) for s in SIZES), "size")

    @property
    def task(self) -> Task:
        return load_task("mapf")

    def context(self, state: dict, settings: Settings, eval_rows: list[dict], env_stats: dict | None) -> str:
        ids = {str(r.get("id")) for r in eval_rows if not r.get("valid")}
        items = {i.id: i for i in load_split(settings.eval_split) if i.id in ids} if ids else {}
        return build_context(variant=settings.context, state=state, settings=settings, view=MapfView(items),
                             eval_rows=eval_rows, env_stats=env_stats)

    def system_prompt(self, settings: Settings) -> str:
        return system_prompt(settings.prompts_dir, settings.train.optimality)

    def answer_schema(self) -> dict:
        return answer_schema()

    def read_reply(self, text: str, finish_reason: str | None, parsed: Any) -> Extracted:
        return read_reply(text, self.shape, finish_reason, parsed)

    def check(self, proposal: Any, current: dict, settings: Settings, *, seed: int, repair: bool) -> Checked:
        return check(proposal, current, feasibility_n=settings.feasibility_n, seed=seed, repair=repair)

    def diff(self, old: dict | None, new: dict | None) -> dict[str, dict[str, dict[str, Any]]]:
        return config_diff(old, new)

    def table(self, old: dict | None, new: dict) -> str:
        return config_table(old, new)

    def classic(self, name: str, config: dict, by_level: dict, memory: dict, rng) -> tuple[dict, str, dict]:
        return CLASSIC[name](config, by_level, memory, rng)

    def first_config(self, given: dict | None, seed: int, n: int) -> EnvConfig:
        return EnvConfig.model_validate(given) if given else random_config(seed)

    def next_config(self, accepted: dict, n: int) -> EnvConfig:
        return checked_config(accepted)

    def trained_config(self, cfg: EnvConfig, n: int, max_train_size: int | None) -> tuple[EnvConfig, str | None]:
        return restrict_sizes(cfg.model_copy(update={"num_instances": n}), max_train_size)

    def stage_items(self, cfg: EnvConfig, n: int, seed: int, path: Path) -> tuple[int, dict[str, Any]]:
        gen = generate(cfg, n, seed, num_agents=cfg.num_agents)
        write_jsonl(path, gen.instances)
        return len(gen.instances), gen.stats

    def split(self, name: str) -> list:
        return load_split(name)

    def verdict_row(self, item: Any, text: str, completion_tokens: int | None, finish_reason: str | None,
                    criterion: str) -> dict[str, Any]:
        return verdict_row(item, text, completion_tokens, finish_reason, criterion)

    def metrics(self, rows, prefix: str = "eval") -> dict[str, Any]:
        return compute_metrics(rows, prefix)

    def final(self, rows) -> tuple[dict[str, Any], str]:
        final = compute_final_metrics(rows)
        return final, final_table_md(final)

    def eval_key_fields(self) -> dict[str, Any]:
        return {}

    def settings_defaults(self) -> dict[str, Any]:
        return {}

    def check_settings(self, settings: Settings) -> None:
        """Stage 0's config, when given, is a strict `EnvConfig` (the splits are checked by graph.preflight)."""
        if settings.start_config is not None:
            try:
                EnvConfig.model_validate(settings.start_config)
            except ValueError as e:
                raise ValueError(f"start_config {json.dumps(settings.start_config)}: {format_validation_error(e)}") \
                    from None

    def report_levels(self) -> list[dict[str, Any]]:
        return [{"index": s, "label": f"{s}x{s} grid", "column": f"{s}x{s}"} for s in SIZES]
