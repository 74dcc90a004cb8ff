"""Score any model as a direct solver on a benchmark split (the paper's proprietary-model and no-RL rows).

    python -m evals.solve_direct --config evals/configs/solve_direct_mini.yaml [--dry-run] [--tables-only]

Each model in the config answers every instance of `split` (the same prompt the policy sees at evaluation,
`env.render_prompt`), every answer is verified by `env.verify`, and one verdict row per instance is
appended to `<out>/<model name>/eval.jsonl` (the row format of `nodes.evaluate`). Models are reached
through `llm_backends`: any OpenAI-compatible endpoint (`kind: openai`, via `llm_backends.openai_chat.OpenAIChat`) or a
local checkpoint (`kind: local`, via `llm_backends.policy.open_policy`).

- Resumable: ids already in a model's eval.jsonl are not asked again; rerun the same command after a crash.
- A model whose API key variable is unset is skipped with a visible `[skip]` line and a note in the table.
- `--dry-run` checks the config, the split and the keys and prints what would be asked; no model is called
  and nothing is written (not even `out/`).
- `--tables-only` rebuilds the tables from the eval.jsonl files alone.

Outputs: `<out>/<name>/{eval.jsonl, metrics.json}`, `<out>/timings.json` (wall time per model, with the
machine it ran on) and `<out>/table.{md,csv,json}`, `failures.csv`: the loop evals' tables
(`evals.tables`), one row per model: per agent count each size's valid % / optimal % and Sum (the
unweighted mean over sizes), the paper's published solver rows beneath on the `test` split; pooled per
agent count and wait subset (the paper's 3/4/5 agents and wait 0.25/0.50/0.75 always, an empty one as
"–"); with 95% Wilson intervals (one run, so no seeds; a bootstrap over instances for Sum) and the wall
times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from evals.config import EvalConfigError, config_command, load_config, repo_path, repo_relative
from evals.grid import EventLog, machine
from evals.packed import PackError, unpacked
from evals.published import RUNS as PUBLISHED_RUNS
from evals.results import committed, read_jsonl, reproduce_folder
from evals.stats import subset_counts, summarize_rows
from evals.tables import write_tables


class ModelSpec(BaseModel):
    """One solver: an OpenAI-compatible endpoint or a local checkpoint."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="row name in the table and folder name under out/")
    kind: Literal["openai", "local"] = Field(description="openai: any OpenAI-compatible endpoint; local: checkpoint")
    base_url: str | None = Field(None, description="kind openai: e.g. https://api.openai.com/v1")
    model: str | None = Field(None, description="kind openai: model id sent with each request")
    api_key_env: str | None = Field(None, description="kind openai: environment variable holding the key "
                                    "(None: no key, e.g. a local vLLM server)")
    checkpoint: str | None = Field(None, description="kind local: short name, Hugging Face id or folder "
                                   "(a relative folder is read from the repository root, like out)")
    base_model: str | None = Field(None, description="kind local: base model of a LoRA adapter checkpoint whose "
                                   "adapter config names no loadable base (short name, Hugging Face id or folder)")
    backend: Literal["transformers", "vllm"] = Field("transformers", description="kind local: how it generates")
    max_concurrency: int = Field(8, ge=1, description="kind openai: parallel requests")
    timeout_s: float = Field(120.0, gt=0, description="kind openai: limit of one HTTP attempt")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
            raise ValueError("must be letters, digits, '_', '-' or '.' (it names a folder)")
        return v

    def missing(self, env: Mapping[str, str]) -> str | None:
        """Why this model cannot be asked here (config hole or missing key), or None."""
        if self.kind == "openai":
            if not self.base_url or not self.model:
                return f"model {self.name!r} (kind openai) needs base_url and model"
            if self.api_key_env and not env.get(self.api_key_env):
                return f"model {self.name!r} needs an API key: set {self.api_key_env}"
        elif not self.checkpoint:
            return f"model {self.name!r} (kind local) needs checkpoint"
        return None


class SolveConfig(BaseModel):
    """solve_direct config."""

    model_config = ConfigDict(extra="forbid")

    split: str = Field("test-mini", description="benchmark split (env.list_splits())")
    limit: int | None = Field(None, ge=1, description="at most this many instances, spread over subsets")
    out: Path = Field(description="output folder (relative to the repository root)")
    max_tokens: int = Field(512, ge=8, description="token limit of one answer")
    temperature: float = Field(0.0, ge=0.0, description="sampling temperature (0: greedy)")
    batch_size: int = Field(8, ge=1, description="instances asked per batch (rows are saved after each)")
    models: list[ModelSpec] = Field(min_length=1, description="the solvers scored, in table order")
    criterion: Literal["soc", "makespan"] | None = Field(
        None, description="what `optimal` means: soc (sum of costs) or makespan (None: makespan when every "
        "verdict row has the makespan fields, else soc); named in every table")
    published: bool | None = Field(None, description="print the paper's published solver rows beneath ours "
                                   "(None: on the full `test` split)")


def local_weights(name: str | None) -> str | None:
    """A `checkpoint` / `base_model` value as open_policy takes it: a relative path that names a folder or
    file under the repository root becomes that absolute path (independent of the current directory);
    anything else (a short name, a Hugging Face id) is passed through."""
    if name is None or Path(name).is_absolute():
        return name
    at_root = repo_path(name)
    return str(at_root) if at_root.exists() else name


def _open(spec: ModelSpec, log_dir: Path, env: Mapping[str, str]):
    if spec.kind == "openai":
        from llm_backends.openai_chat import OpenAIChat

        key = env.get(spec.api_key_env) if spec.api_key_env else None
        return OpenAIChat(spec.base_url, spec.model, api_key=key, backend=spec.name, timeout_s=spec.timeout_s,
                          max_concurrency=spec.max_concurrency)
    from llm_backends.policy import open_policy

    return open_policy(local_weights(spec.checkpoint), spec.backend, log_dir, base_model=local_weights(spec.base_model))


def solve_model(spec: ModelSpec, instances: list[Any], cfg: SolveConfig, out: Path, log: EventLog,
                env: Mapping[str, str]) -> int:
    """Ask the instances not yet answered; append verdict rows batch by batch. Returns rows added."""
    from tqdm import tqdm

    from env import render_prompt
    from families.mapf import verdict_row

    folder = out / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "eval.jsonl"
    done = {r["id"] for r in read_jsonl(path)} if path.is_file() else set()
    todo = [i for i in instances if i.id not in done]
    if not todo:
        log(f"[skip] {spec.name}: all {len(instances)} instances already answered in {path}")
        return 0
    log(f"[start] {spec.name}: {len(todo)} to ask ({len(done)} already answered)")
    t0 = time.monotonic()
    added = 0
    cm = _open(spec, folder, env)
    with cm as model:
        bar = tqdm(total=len(todo), desc=spec.name, unit="inst", file=sys.stderr)
        for start in range(0, len(todo), cfg.batch_size):
            batch = todo[start : start + cfg.batch_size]
            msgs = [[{"role": "user", "content": render_prompt(inst)}] for inst in batch]
            results = model.chat_batch(msgs, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
            with open(path, "a") as f:
                for inst, res in zip(batch, results, strict=True):
                    row = verdict_row(inst, res.text, res.completion_tokens, getattr(res, "finish_reason", None))
                    row["latency_s"] = res.latency_s
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            added += len(batch)
            bar.update(len(batch))
        bar.close()
    wall = time.monotonic() - t0
    record_timing(out, spec.name, wall, added)
    log(f"[done] {spec.name}: {added} answered in {wall:.0f}s")
    return added


def record_timing(out: Path, name: str, wall_s: float, answered: int) -> None:
    """Add one call's wall time (model start-up included) and this machine to `<out>/timings.json`."""
    path = out / "timings.json"
    try:
        timings = json.loads(path.read_text())
    except (OSError, ValueError):
        timings = {}
    t = timings.setdefault(name, {"wall_s": 0.0, "calls": 0, "answered": 0})
    t["wall_s"] = round(t["wall_s"] + wall_s, 1)
    t["calls"] += 1
    t["answered"] += answered
    here = machine()
    t["machine"] = here
    if here not in t.setdefault("machines", []):
        t["machines"].append(here)
    path.write_text(json.dumps(timings, indent=2) + "\n")


def write_solve_tables(cfg: SolveConfig, out: Path, ids: set[str] | None, command: str | None,
                       notes: list[str], source: Path | None = None) -> dict[str, Any]:
    """table.md/csv/json and failures.csv from `<out>/<name>/eval.jsonl` (only rows of this split's chosen
    ids; `ids` None: every committed row, as `--tables-only` does, so a table rebuilt after the split changed
    still says what its verdicts say), through the loop evals' tables (`evals.tables.write_tables`): each model is one arm with one run,
    so its intervals are Wilson's (or a bootstrap over instances for a Sum over sizes). `source`: the folder the
    answers are read from when not `out` (`out/answers.tar.xz` unpacked, `evals.packed`)."""
    from families.metrics import compute_final_metrics

    data: dict[tuple[str, int], list[dict]] = {}
    for spec in cfg.models:
        path = (source or out) / spec.name / "eval.jsonl"
        if not path.is_file():
            continue
        rows = [r for r in read_jsonl(path) if ids is None or r["id"] in ids]
        if not rows:
            continue
        if ids is not None and len(rows) < len(ids):
            notes.append(f"`{spec.name}` answered {len(rows)} of {len(ids)} instances so far (rerun to finish)")
        data[(spec.name, 0)] = rows
        (out / spec.name / "metrics.json").write_text(json.dumps(compute_final_metrics(rows), indent=2) + "\n")
    names = [name for name, _ in data]
    timings = _timings(out, names)
    by_machine: dict[str, list[str]] = {}
    for name, t in timings.items():
        by_machine.setdefault(t.get("machine") or "a machine that was not recorded", []).append(
            f"{name} {t['wall_s']:.0f}s for {t.get('answered', 0)} answer(s)")
    notes = notes + [f"Wall time on {m}: {', '.join(v)}." for m, v in by_machine.items()]
    title = f"Direct solvers on `{cfg.split}`" + (f" (first {cfg.limit})" if cfg.limit else "")
    if not data:
        (out / "table.md").write_text("\n".join([f"# {title}", "", "No answers yet.", ""] + [f"- {n}" for n in notes]) + "\n")
        return {}
    table = summarize_rows(data, names, None, criterion=cfg.criterion)
    counts = {name: subset_counts(rows, table["criterion"]) for (name, _), rows in data.items()}
    show = cfg.split == "test" if cfg.published is None else cfg.published
    write_tables(table, out, title=title, command=command, arm_header="model", notes=notes,
                 extra={"split": cfg.split, "limit": cfg.limit, "counts": counts, "timings_s": timings},
                 published=PUBLISHED_RUNS["solvers"] if show else (), source="`<model>/eval.jsonl`")
    return counts


def _timings(out: Path, names: list[str]) -> dict[str, Any]:
    try:
        timings = json.loads((out / "timings.json").read_text())
    except (OSError, ValueError):
        return {}
    return {n: timings[n] for n in names if isinstance(timings.get(n), dict)}


def _left(out: Path, name: str, instances: list[Any]) -> int:
    """How many of `instances` model `name` has not answered yet in `out`."""
    path = out / name / "eval.jsonl"
    done = {r["id"] for r in read_jsonl(path)} if path.is_file() else set()
    return sum(1 for i in instances if i.id not in done)


def reproduce_target(out: Path, args) -> Path:
    """The folder answers go to: `--out DIR`, a new `<out>-<UTC time>` for `--fresh`, else the config's `out`."""
    if args.fresh and args.tables_only:
        raise EvalConfigError("--fresh --tables-only: a fresh folder has no answers to tabulate; drop --fresh")
    new = reproduce_folder(out, args.out, args.fresh)
    if new is None:
        return out
    if args.fresh:
        print(f"note: answers and tables go to {repo_relative(new)}", file=sys.stderr)
    return new


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.solve_direct", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, type=Path, help="YAML/TOML config (see evals/configs/)")
    p.add_argument("--dry-run", action="store_true", help="check config, split and keys; call no model")
    p.add_argument("--tables-only", action="store_true", help="rebuild the tables from the eval.jsonl files")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="write answers and tables to DIR instead of the config's out: reproduce a config without "
                        "touching its committed results")
    p.add_argument("--fresh", action="store_true",
                   help="reproduce the config into a new timestamped folder beside its out (<out>-<UTC time>)")
    args = p.parse_args(argv)
    env = dict(os.environ)
    try:
        cfg = load_config(args.config, SolveConfig)
        names = [m.name for m in cfg.models]
        if len(set(names)) != len(names):
            raise EvalConfigError(f"config {args.config}: model names must be distinct, got {names}")
        from env import list_splits, load_split
        from nodes.evaluate import limit_instances

        splits = list_splits()
        if cfg.split not in splits:
            raise EvalConfigError(f"config {args.config}: split {cfg.split!r} unknown; allowed: {', '.join(splits)}")
        try:
            instances = limit_instances(load_split(cfg.split), cfg.limit)
        except Exception as e:  # noqa: BLE001 - a missing or corrupt split file: one line, not a traceback
            raise EvalConfigError(f"cannot load split {cfg.split!r}: {str(e).splitlines()[0]}") from None
        out = reproduce_target(repo_path(cfg.out), args)
        if not args.tables_only and args.out is None and not args.fresh and committed(out):
            todo = [m.name for m in cfg.models if not m.missing(env) and _left(out, m.name, instances)]
            if todo:
                raise EvalConfigError(
                    f"{repo_relative(out)} holds committed results and {', '.join(todo)} would add answers to them: pass "
                    "--fresh (a new folder beside it) or --out DIR to reproduce the config, or --tables-only")
            print(f"note: every model already answered every instance in {repo_relative(out)} (committed); nothing was asked "
                  "or written. Pass --fresh or --out DIR to reproduce the config, --tables-only to rebuild its tables",
                  file=sys.stderr)
            return 0
    except EvalConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = config_command(args.config)
    if command is None:
        print(f"warning: {args.config} does not open with a comment holding the command that runs it",
              file=sys.stderr)
    if not args.dry_run:  # a dry run creates nothing
        out.mkdir(parents=True, exist_ok=True)
    log = EventLog(None if args.dry_run else out / "events.log")
    notes: list[str] = []
    failed = False
    if not args.tables_only:
        for spec in cfg.models:
            why = spec.missing(env)
            if why:
                log(f"[skip] {spec.name}: {why}")
                notes.append(f"`{spec.name}` skipped: {why}")
                continue
            if args.dry_run:
                n_todo = _left(out, spec.name, instances)
                where = (spec.base_url if spec.kind == "openai" else f"{local_weights(spec.checkpoint)} ({spec.backend}"
                         + (f", base {local_weights(spec.base_model)})" if spec.base_model else ")"))
                log(f"[plan] {spec.name}: {n_todo} of {len(instances)} {cfg.split} instances to ask via "
                    f"{spec.kind} {where}")
                continue
            try:
                solve_model(spec, instances, cfg, out, log, env)
            except KeyboardInterrupt:
                print("\ninterrupted; rerun the same command to resume", file=sys.stderr)
                return 130
            except Exception as e:  # noqa: BLE001 - one model failing must not lose the others' rows
                log(f"[fail] {spec.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
                    "rerun to resume")
                notes.append(f"`{spec.name}` failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                failed = True
    if args.dry_run:
        log(f"[dry-run] split {cfg.split}: {len(instances)} instances; nothing was asked")
        return 0
    try:
        with unpacked(out) as source:
            write_solve_tables(cfg, out, None if args.tables_only else {i.id for i in instances}, command, notes,
                               source)
    except PackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print((out / "table.md").read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
