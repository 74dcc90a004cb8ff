"""Evaluate the current policy: answer a benchmark split, verify every answer, aggregate.

The split, the prompts, the verdict rows, the metrics and the final table are the run's family's
(`families/base.py` `LoopFamily`); what follows names MAPF-FrozenLake's.

`evaluate` runs after every train stage on `settings.eval_split` (MAPF: the fixed 2-agent validation set) and writes
`stage_<k>/eval.jsonl` (one row per instance: id, level, tags, the raw answer text and the verdict fields) and
`stage_<k>/metrics.json`. `final_evaluate` runs once at the end on `settings.final_split` and writes `final/` with the
family's tables. At stage 0, a run that began from a cached SFT warm start evaluates that start first, the same way,
into `stage_0/start/` (`evaluate_start`): the row its learning is measured from. Its greedy answers are kept in the
cache (`<cache>/start_evals/`, per CPU and torch / vLLM / transformers version) and verified again on every reuse.

Metrics are pure functions of the rows of an `eval.jsonl` (`families.metrics`), so any table can be recomputed from
the saved answers: `eval/valid_rate`, `eval/optimal_rate`, `eval/valid_rate/level_<k>`, `eval/optimal_rate/level_<k>`,
`eval/failure/<name>`, `eval/n`, and a `by_level` table `{"<level>": {n, valid, optimal, valid_rate, optimal_rate,
failures}}`. With `eval_samples` k, each question of the start's, every stage's and the final evaluation is also
answered k times at a temperature (`families/sampled.py`, `eval_sampled.jsonl`): `<prefix>/sampled_valid_rate`
(mean@k), its interval, per level, `<prefix>/samples_k`, `<prefix>/sample_temperature`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from families import DEFAULT_TASK, LoopFamily, family_of
from families.metrics import sampled_metrics, upgrade_metrics
from families.sampled import run_sampled, sample_key
from trainer import stop
from trainer.files import stage_dir, weights_sha256, write_text_atomic

if TYPE_CHECKING:
    from langgraph.runtime import Runtime

    from graph.settings import RunContext, Settings
    from graph.state import LoopState
    from llm_backends.base import ChatModel

# ----------------------------------------------------------------------------- answering and verifying


def instance_tags(inst: Any) -> dict[str, Any]:
    """The subset tags of an item (`{"agents": 3, "wait": 0.25}` on MAPF's test splits, else {})."""
    tags = getattr(inst, "tags", None)
    return dict(tags) if isinstance(tags, dict) else {}


def limit_instances(instances: Sequence[Any], limit: int | None) -> list[Any]:
    """At most `limit` instances, taken round-robin over (agents, wait subset, size) groups so that a small
    cap still covers every group; order inside a group is kept. `None` keeps all."""
    if limit is None or limit >= len(instances):
        return list(instances)
    groups: dict[tuple, list[Any]] = defaultdict(list)
    for inst in instances:
        tags = instance_tags(inst)
        key = (getattr(inst, "num_agents", None), str(tags.get("wait")), getattr(inst, "size", None)
               if hasattr(inst, "size") else getattr(inst, "level", None))
        groups[key].append(inst)
    picked: list[Any] = []
    keys = _balanced_order(list(groups))
    depth = 0
    while len(picked) < limit:
        for key in keys:
            if depth < len(groups[key]) and len(picked) < limit:
                picked.append(groups[key][depth])
        depth += 1
    return picked


def _balanced_order(keys: list[tuple]) -> list[tuple]:
    """Group keys ordered so that every prefix spreads evenly over each dimension (agents, wait, size) and
    each pair of them: the next key is the one whose values, then value pairs, were used least so far (ties:
    numeric order). A cap of 9 on the test split then holds every (agents, wait) pair once, on 9 sizes."""
    from itertools import combinations

    def num(x: Any) -> float:
        try:
            return float(x)
        except (TypeError, ValueError):
            return -1.0

    left = sorted(keys, key=lambda k: tuple(num(x) for x in k))
    single: dict = defaultdict(int)
    pair: dict = defaultdict(int)
    order: list[tuple] = []

    def score(k: tuple) -> tuple[int, int]:
        return (
            sum(single[i, v] for i, v in enumerate(k)),
            sum(pair[a, b] for a, b in combinations(enumerate(k), 2)),
        )

    while left:
        best = min(left, key=score)  # min keeps the first of equal scores: numeric order
        left.remove(best)
        order.append(best)
        for i, v in enumerate(best):
            single[i, v] += 1
        for a, b in combinations(enumerate(best), 2):
            pair[a, b] += 1
    return order


def answer_and_verify(
    instances: Sequence[Any],
    model: Any,
    *,
    max_tokens: int,
    batch_size: int,
    desc: str = "evaluating",
    progress: bool = True,
    prompt_style: str = "full",
    criterion: str = "makespan",
    on_batch: Callable[[list[dict]], None] | None = None,
    family: LoopFamily | None = None,
) -> list[dict]:
    """Ask `model` (a `llm_backends.base.ChatModel`) every instance's prompt in batches and verify each answer.

    The prompt is the policy's own (the family's task's `prompt` in `prompt_style`, the run's `train.prompt_style`;
    for MAPF-FrozenLake, the default family, `env.library.prompt_messages`), so the policy is evaluated on the
    prompt it was trained on.

    Returns one row per instance, in order: id, size, num_agents, tags, text, completion_tokens,
    finish_reason and the verdict fields (valid, optimal by `criterion`, failure, cost, optimal_cost, details,
    makespan, optimal_makespan, criterion) and optimal_soc (= optimal_cost).

    `on_batch(rows)` gets each batch's rows as soon as they are verified (run_eval's journal). Between batches,
    a requested stop (SIGINT/SIGTERM, `trainer.stop`) raises `StageInterrupted`: the answers so far are kept.
    """
    from tqdm.auto import tqdm

    family = family or family_of(DEFAULT_TASK)
    rows: list[dict] = []
    with tqdm(total=len(instances), desc=desc, unit="answer", disable=not progress, leave=False) as bar:
        for start in range(0, len(instances), batch_size):
            batch = instances[start : start + batch_size]
            messages = [family.task.prompt(inst, prompt_style) for inst in batch]
            results = model.chat_batch(messages, max_tokens=max_tokens, temperature=0.0)
            new = [family.verdict_row(inst, res.text, res.completion_tokens, getattr(res, "finish_reason", None),
                                      criterion) for inst, res in zip(batch, results, strict=True)]
            rows += new
            if on_batch is not None:
                on_batch(new)
            bar.update(len(batch))
            bar.set_postfix(valid=f"{sum(r['valid'] for r in rows)}/{len(rows)}")
            if stop.stop_requested() and len(rows) < len(instances):
                raise stop.StageInterrupted(f"stopped during {desc} after {len(rows)} of {len(instances)} answers "
                                            "(kept: the evaluation goes on from there on resume)")
    return rows


# ----------------------------------------------------------------------------- files

def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Written to a temporary file and renamed (`trainer.files`): never half a file, never a donor's inode."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_rows(path: Path) -> list[dict]:
    """The rows of an `eval.jsonl` (to recompute metrics from saved answers)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_json(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------- nodes


JOURNAL = "eval.partial.jsonl"  # answers so far of an unfinished evaluation: a header line (its key), then rows
KEY_FILE = "eval.key.json"  # which policy, split and settings a finished eval.jsonl answers


def eval_key(split: str, instances: Sequence[Any], *, checkpoint: str | None, settings: Settings,
             model: ChatModel | None = None) -> dict[str, Any]:
    """What makes two evaluations give the same rows: the split and its instances, the policy (the sha256 of a
    checkpoint's weight files, so a moved or copied run folder keeps its answers; the name of a model that is not
    a folder), how it answers (backend, dtype, prompt, token budget) and the optimality criterion of the
    verdicts. Saved answers are reused only under an equal key."""
    family = family_of(settings)
    ids = "\n".join(str(family.task.item_id(inst)) for inst in instances)
    if model is not None:
        policy: Any = f"{type(model).__module__}.{type(model).__qualname__}:{getattr(model, 'model', '')}"
    else:
        policy = str(checkpoint or settings.policy_model)
        if Path(policy).is_dir():
            policy = weights_sha256(Path(policy)) or policy
    return {
        "split": split,
        "n": len(instances),
        "instances": hashlib.sha256(ids.encode()).hexdigest()[:16],
        "policy": policy,
        "backend": settings.policy_backend,
        "dtype": settings.policy_dtype,
        "prompt_style": settings.train.prompt_style,
        "max_tokens": settings.eval_max_tokens,
        "criterion": settings.train.optimality,
        **family.eval_key_fields(),
    }


def saved_answers(out_dir: Path, key: dict[str, Any]) -> dict[str, dict]:
    """Rows already answered under `key` in `out_dir`, by instance id: a finished `eval.jsonl` whose
    `eval.key.json` equals `key`, else the journal of an interrupted evaluation whose header equals `key`
    (a line cut off by a kill is dropped). Anything else: {} (answers of another policy are never reused)."""
    try:
        if json.loads((out_dir / KEY_FILE).read_text()) == key:
            return {r["id"]: r for r in read_rows(out_dir / "eval.jsonl")}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        lines = (out_dir / JOURNAL).read_text(encoding="utf-8").splitlines()
        if not lines or json.loads(lines[0]).get("key") != key:
            return {}
    except (OSError, ValueError, AttributeError):
        return {}
    rows = {}
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the last line of a killed writer
        if isinstance(row, dict) and "id" in row:
            rows[row["id"]] = row
    return rows


def run_eval(
    split: str,
    out_dir: Path,
    *,
    checkpoint: str | None,
    settings: Settings,
    limit: int | None = None,
    model: ChatModel | None = None,
    log_dir: Path | None = None,
    desc: str | None = None,
) -> list[dict]:
    """Answer `split` with the policy (or the given `model`), verify, write `out_dir/eval.jsonl`.

    Resumable: each batch's rows are appended to `out_dir/eval.partial.jsonl` as they come, so an evaluation
    that is killed or stopped (SIGTERM: at the next batch) keeps its answers, and the next call with the same
    `eval_key` answers only the rest. A finished evaluation leaves `eval.jsonl` and `eval.key.json`; calling
    again with the same key reuses it without starting the policy. A vLLM server started for it logs into
    `log_dir` (default `out_dir`)."""
    family = family_of(settings)
    item_id = family.task.item_id
    instances = limit_instances(family.split(split), limit)
    key = eval_key(split, instances, checkpoint=checkpoint, settings=settings, model=model)
    done = saved_answers(out_dir, key)  # split ids are unique (env.load_split checks)
    todo = [inst for inst in instances if item_id(inst) not in done]
    if done:
        print(f"eval {split}: {len(instances) - len(todo)} of {len(instances)} answers kept from an earlier "
              "evaluation of the same policy", flush=True)
    if todo:
        (out_dir / KEY_FILE).unlink(missing_ok=True)
        kept = [done[item_id(inst)] for inst in instances if item_id(inst) in done]
        # rewritten, not appended to: drops a cut-off line, and never writes through a hard link (a fork's files)
        write_jsonl(out_dir / JOURNAL, [{"key": key}, *kept])
        with open(out_dir / JOURNAL, "a", encoding="utf-8") as journal:

            def keep(rows: list[dict]) -> None:
                journal.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                journal.flush()
                os.fsync(journal.fileno())

            answer = partial(answer_and_verify, todo, max_tokens=settings.eval_max_tokens,
                             batch_size=settings.eval_batch_size, desc=desc or f"eval {split}",
                             prompt_style=settings.train.prompt_style, criterion=settings.train.optimality,
                             on_batch=keep, family=family)
            if model is not None:
                new = answer(model)
            else:
                with policy_opener(checkpoint, settings, log_dir or out_dir)() as policy:
                    new = answer(policy)
        done.update((r["id"], r) for r in new)
    rows = [done[item_id(inst)] for inst in instances]
    write_jsonl(out_dir / "eval.jsonl", rows)
    write_json(out_dir / KEY_FILE, key)
    (out_dir / JOURNAL).unlink(missing_ok=True)
    return rows


def policy_opener(checkpoint: str | None, settings: Settings, log_dir: Path) -> Callable[[], Any]:
    """What opens the policy that answers an evaluation (`llm_backends.policy.open_policy`, a context manager)."""
    from llm_backends.policy import open_policy

    return partial(open_policy, checkpoint or settings.policy_model, settings.policy_backend, log_dir,
                   base_model=settings.policy_model,  # the base of a LoRA checkpoint
                   batch_size=settings.eval_batch_size,
                   max_concurrency=settings.eval_batch_size,  # one batch in flight at once on a vLLM server
                   keep_server=settings.keep_server, dtype=settings.policy_dtype)


def with_sampled(metrics: dict[str, Any], out_dir: Path, checkpoint: str | None, settings: Settings,
                 model: ChatModel | None, split: str, limit: int | None, prefix: str = "eval") -> dict[str, Any]:
    """`metrics` with the mean@k of `settings.eval_samples` answers per question of `split` sampled at the run's sample
    temperature (`families/sampled.py`: `out_dir/eval_sampled.jsonl`, resumable; `families.metrics.sampled_metrics`)."""
    family, k, temperature = family_of(settings), settings.eval_samples, settings.sample_temperature
    instances = limit_instances(family.split(split), limit)
    greedy = json.loads((out_dir / KEY_FILE).read_text())  # the greedy answers' key, just written (weights hashed once)
    rows = run_sampled(instances, out_dir, sample_key(greedy, k, temperature),
                       model=model or policy_opener(checkpoint, settings, out_dir), family=family, k=k,
                       temperature=temperature, max_tokens=settings.eval_max_tokens, batch_size=settings.eval_batch_size,
                       prompt_style=settings.train.prompt_style, criterion=settings.train.optimality)
    return sampled_metrics(metrics, rows, k, temperature, prefix)


def sampled_note(metrics: dict[str, Any], prefix: str = "eval") -> str:
    """`, sampled valid 0.412 (mean@4)` for a progress line, or nothing where no answer was sampled."""
    k = metrics.get(f"{prefix}/samples_k")
    return f", sampled valid {metrics[f'{prefix}/sampled_valid_rate']:.3f} (mean@{k})" if k else ""


START_DIR = "start"  # stage_0/start/: the warm start's own evaluation (eval.jsonl, eval.key.json, metrics.json)
START_CACHE = "start_evals"  # <cache>/start_evals/<16 hex>.json: its answers, kept for every run of that start


def start_cache_file(key: dict[str, Any], instances: Sequence[Any], settings: Settings) -> Path:
    """Where the answers of an evaluation under `key` of a cached warm start are kept, beside the warm starts. Beyond
    `key` (weights, instance ids, backend, dtype, prompt style, token budget), the cache is shared across runs and
    code versions, so it also names what else changes greedy answers: the rendered prompts themselves (the text and
    the maps), the chat template's thinking switch, the batch, the machine (CPU, usable cores, GPUs) and the torch /
    vLLM / transformers versions. Answers computed elsewhere or otherwise are not reused."""
    from llm_backends.models import cache_root
    from trainer.provenance import cpu_id, machine, package_versions

    family = family_of(settings)
    prompts = json.dumps([family.task.prompt(inst, settings.train.prompt_style) for inst in instances],
                         sort_keys=True)
    mach = machine()
    spec = json.dumps({
        "key": key, "prompts": hashlib.sha256(prompts.encode()).hexdigest(),
        "enable_thinking": settings.train.enable_thinking, "batch": settings.eval_batch_size,
        "cpu": cpu_id(), "cores": mach.get("cores_usable"), "gpus": mach.get("gpus"),
        "versions": {k: v for k, v in package_versions().items() if k in ("torch", "vllm", "transformers")},
    }, sort_keys=True)
    return cache_root() / START_CACHE / f"{hashlib.sha256(spec.encode()).hexdigest()[:16]}.json"


def _kept_start_rows(file: Path, key: dict[str, Any], instances: Sequence[Any], criterion: str,
                     family: LoopFamily) -> list[dict] | None:
    """The kept answers of `file`, verified again (a kept answer is only text), or None when there are none for
    exactly `key` and these instances (missing, unreadable, another key, a field of the wrong type)."""
    try:
        kept = json.loads(file.read_text())
        answers = kept["answers"]
        if kept["key"] != key or [a["id"] for a in answers] != [family.task.item_id(inst) for inst in instances]:
            return None
        for a in answers:
            tokens, reason = a.get("completion_tokens"), a.get("finish_reason")
            if (not isinstance(a["text"], str) or not (tokens is None or type(tokens) is int)
                    or not (reason is None or isinstance(reason, str))):
                return None
        return [family.verdict_row(inst, a["text"], a.get("completion_tokens"), a.get("finish_reason"), criterion)
                for inst, a in zip(instances, answers, strict=True)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _finished_start(out_dir: Path) -> dict[str, Any] | None:
    """`out_dir/metrics.json` of a finished start evaluation, if its figures are numbers (else it is redone)."""
    try:
        done = json.loads((out_dir / "metrics.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    numbers = ("eval/n", "eval/valid_rate", "eval/optimal_rate")
    ok = isinstance(done, dict) and all(type(done.get(k)) in (int, float) for k in numbers)
    return upgrade_metrics(done) if ok else None


def evaluate_start(run_dir: Path, stage_metrics: dict[str, Any], settings: Settings,
                   model: ChatModel | None = None) -> dict[str, Any] | None:
    """The warm start's own evaluation, on the same split, answers and settings as every stage's: the row the
    run's learning is measured from (the report's "start" row; `by_stage/eval/*` at step -1 in TensorBoard).

    Only for a run whose stage 0 began from a cached warm start (`stage_metrics["sft/cache_path"]`). Its answers
    are kept in the cache (`start_cache_file`) and verified again on reuse, so a start is answered once per
    machine, not once per run. Written to `stage_0/start/` (resumable like any evaluation); a run that has it
    there already reuses it. Returns its metrics (`compute_metrics`, plus `start/...` bookkeeping), or None when
    the run had no cached start or the cache entry is gone (a copied run on another machine)."""
    out_dir = stage_dir(run_dir, 0) / START_DIR
    if (done := _finished_start(out_dir)) is not None:
        return done
    path = stage_metrics.get("sft/cache_path")
    if not isinstance(path, str) or not Path(path).is_dir():
        return None
    family = family_of(settings)
    instances = limit_instances(family.split(settings.eval_split), settings.eval_limit)
    key = eval_key(settings.eval_split, instances, checkpoint=path, settings=settings, model=model)
    cache = start_cache_file(key, instances, settings) if model is None else None  # a stand-in's are not the start's
    kept = None if cache is None else _kept_start_rows(cache, key, instances, settings.train.optimality, family)
    # only answers this machine gave go into its cache: not those of a run folder copied here mid-evaluation
    answered_here = kept is None and not saved_answers(out_dir, key)
    out_dir.mkdir(parents=True, exist_ok=True)
    if kept is not None:  # run_eval then finds them answered under this key and starts no policy
        write_jsonl(out_dir / "eval.jsonl", kept)
        write_json(out_dir / KEY_FILE, key)
        print(f"eval {settings.eval_split}: the warm start's {len(kept)} answers reused from {cache} "
              "(verified again)", flush=True)
    rows = run_eval(settings.eval_split, out_dir, checkpoint=path, settings=settings, limit=settings.eval_limit,
                    model=model, log_dir=out_dir.parent, desc=f"eval {settings.eval_split} (warm start)")
    if cache is not None and answered_here:
        answers = [{k: r.get(k) for k in ("id", "text", "completion_tokens", "finish_reason")} for r in rows]
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, {"key": key, "answers": answers})
    metrics = family.metrics(rows)
    if settings.eval_samples:  # sampled like every stage (its answers are not cached: they are drawn afresh)
        metrics = with_sampled(metrics, out_dir, path, settings, model, settings.eval_split, settings.eval_limit)
    metrics.update({"start/cache_key": stage_metrics.get("sft/cache_key"), "start/cache_path": path,
                    "start/answers_reused": kept is not None})
    write_json(out_dir / "metrics.json", metrics)
    return metrics


def start_update(run_dir: Path, stage_metrics: dict[str, Any], settings: Settings,
                 model: ChatModel | None = None) -> dict[str, Any]:
    """The evaluate node's share of the start: {"start_metrics", "log": [its line]}, or {"log": []} without one."""
    start = evaluate_start(run_dir, stage_metrics, settings, model=model)
    if start is None:
        return {"log": []}
    return {"start_metrics": start, "log": [
        f"warm start: eval on {settings.eval_split} (n={start['eval/n']}): valid {start['eval/valid_rate']:.3f}, "
        f"optimal {start['eval/optimal_rate']:.3f}{sampled_note(start)}"]}


def evaluate(
    state: LoopState, runtime: Runtime[RunContext], model: ChatModel | None = None
) -> dict[str, Any]:
    """Node: the current checkpoint answers the validation split; returns {"metrics", "log"}. At stage 0 the
    cached warm start the stage began from answers it first (`evaluate_start`, also {"start_metrics"}). `model`
    answers instead of the policy (tests)."""
    settings = runtime.context.settings
    stage = int(state.get("stage") or 0)
    out_dir = stage_dir(runtime.context.run_dir, stage)
    # stage_k/metrics.json already holds train_stage's figures (`train/...`, and at stage 0 the warm start's `sft/...`:
    # which cached start the run used): keep them beside `eval/...`.
    on_disk = out_dir / "metrics.json"
    kept = {}
    if on_disk.is_file():
        try:
            kept = {k: v for k, v in json.loads(on_disk.read_text()).items() if k.startswith(("train/", "sft/"))}
        except (OSError, ValueError):
            kept = {}
    update: dict[str, Any] = {"log": []}
    if stage == 0:
        update = start_update(runtime.context.run_dir, kept, settings, model=model)
    rows = run_eval(settings.eval_split, out_dir, checkpoint=state.get("checkpoint"), settings=settings,
                    limit=settings.eval_limit, model=model)
    metrics = family_of(settings).metrics(rows)
    if settings.eval_samples:  # mean@k beside the greedy figures
        metrics = with_sampled(metrics, out_dir, state.get("checkpoint"), settings, model, settings.eval_split,
                               settings.eval_limit)
    write_json(on_disk, {**kept, **metrics})
    line = (f"stage {stage}: eval on {settings.eval_split} (n={metrics['eval/n']}): valid "
            f"{metrics['eval/valid_rate']:.3f}, optimal {metrics['eval/optimal_rate']:.3f}{sampled_note(metrics)}")
    return {**update, "metrics": metrics, "log": [*update["log"], line]}


def final_evaluate(
    state: LoopState, runtime: Runtime[RunContext], model: ChatModel | None = None
) -> dict[str, Any]:
    """Node: the last checkpoint answers the held-out benchmark; writes `final/{eval.jsonl, metrics.json,
    table.md}` (and, with `final_cpu_split`, the same in `final_cpu/` for that split) and returns
    {"final_metrics", "log"}. `model` answers instead of the policy (tests)."""
    settings = runtime.context.settings
    out_dir = Path(runtime.context.run_dir) / "final"
    rows = run_eval(
        settings.final_split,
        out_dir,
        checkpoint=state.get("checkpoint"),
        settings=settings,
        limit=settings.final_limit,
        model=model,
    )
    final, table = family_of(settings).final(rows)
    if settings.eval_samples:  # mean@k of the held-out split too
        final = with_sampled(final, out_dir, state.get("checkpoint"), settings, model, settings.final_split,
                             settings.final_limit, prefix="final")
    write_json(out_dir / "metrics.json", final)
    write_text_atomic(out_dir / "table.md", table)
    lines = [f"final on {settings.final_split} (n={final['final/n']}): valid {final['final/valid_rate']:.3f}, "
             f"optimal {final['final/optimal_rate']:.3f}{sampled_note(final, 'final')}"]
    if settings.final_cpu_split:  # beside the held-out benchmark, never instead of it
        cpu_dir = out_dir.parent / "final_cpu"
        cpu, cpu_table = family_of(settings).final(run_eval(settings.final_cpu_split, cpu_dir,
                                                            checkpoint=state.get("checkpoint"), settings=settings,
                                                            model=model))
        write_json(cpu_dir / "metrics.json", {**cpu, "final/split": settings.final_cpu_split})
        write_text_atomic(cpu_dir / "table.md", cpu_table)
        lines.append(f"final on {settings.final_cpu_split} (n={cpu['final/n']}, the CPU-scale held-out split): "
                     f"valid {cpu['final/valid_rate']:.3f}, optimal {cpu['final/optimal_rate']:.3f}")
    return {"final_metrics": final, "log": lines}
