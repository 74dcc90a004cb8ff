"""Sampled answers beside the greedy ones: mean@k of an evaluation (`settings.eval_samples` answers per question at
`settings.eval_sample_temperature`, the training temperature unless set).

`run_sampled` asks the same chat model as the greedy evaluation (`nodes.evaluate.run_eval`) each question's prompt
`k` times at the temperature (a `ChatModel` has no `n`: the prompt is repeated; a vLLM server's prefix cache
prefills it once), verifies every answer with the family's verdict, and writes `eval_sampled.jsonl`: one verdict
row per answer, with the question's `id`, its `sample` index (0..k-1) and `level`. Its figures are
`families.metrics.sampled_metrics` of those rows, so they can be recomputed from the saved answers.

Resumable as the greedy answers are, in files of its own (the greedy `eval.jsonl` and `eval.key.json` are never
touched): each batch is appended to `eval_sampled.partial.jsonl` under a header that holds the key (the greedy
evaluation's `eval_key` plus `k` and the temperature), and a finished `eval_sampled.jsonl` with an equal
`eval_sampled.key.json` is reused without asking the model again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from families.base import LoopFamily
from trainer import stop
from trainer.files import write_text_atomic

ROWS = "eval_sampled.jsonl"
KEY_FILE = "eval_sampled.key.json"
JOURNAL = "eval_sampled.partial.jsonl"


def sample_key(greedy_key: dict[str, Any], k: int, temperature: float) -> dict[str, Any]:
    """What makes two sampled evaluations alike: the greedy evaluation's key, the samples per question, the
    temperature."""
    return {**greedy_key, "samples_k": k, "sample_temperature": temperature}


def _lines(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # the last line of a killed writer
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _kept(out_dir: Path, key: dict[str, Any]) -> dict[tuple[str, int], dict]:
    """Rows already answered under `key`, by (question id, sample index): a finished file with an equal key file,
    else a journal whose header is the key; anything else: {} (answers of another policy or temperature)."""
    rows: list[dict] = []
    try:
        if json.loads((out_dir / KEY_FILE).read_text()) == key:
            rows = _lines(out_dir / ROWS)
    except (OSError, ValueError, TypeError):
        rows = []
    if not rows:
        try:
            journal = _lines(out_dir / JOURNAL)
        except OSError:
            journal = []
        rows = journal[1:] if journal and journal[0].get("key") == key else []
    return {(str(r["id"]), int(r["sample"])): r for r in rows if "id" in r and isinstance(r.get("sample"), int)}


def run_sampled(
    instances: Sequence[Any],
    out_dir: Path,
    key: dict[str, Any],
    *,
    model: Any | Callable[[], contextlib.AbstractContextManager[Any]],
    family: LoopFamily,
    k: int,
    temperature: float,
    max_tokens: int,
    batch_size: int,
    prompt_style: str,
    criterion: str,
) -> list[dict]:
    """`k` sampled answers of `model` to each of `instances`, verified; returns and writes `out_dir/eval_sampled.jsonl`
    (rows in question order, then sample order). `model` is a chat model, or a callable that opens one (the policy,
    opened only when an answer is missing). Between batches a requested stop raises `StageInterrupted` (kept)."""
    item_id = family.task.item_id
    done = _kept(out_dir, key)
    wanted = [(inst, s) for inst in instances for s in range(k)]
    todo = [(inst, s) for inst, s in wanted if (str(item_id(inst)), s) not in done]
    if todo:
        (out_dir / KEY_FILE).unlink(missing_ok=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out_dir / JOURNAL, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                     for r in [{"key": key}, *done.values()]))
        opened = contextlib.nullcontext(model) if hasattr(model, "chat_batch") else model()
        with opened as chat, open(out_dir / JOURNAL, "a", encoding="utf-8") as journal:
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                results = chat.chat_batch([family.task.prompt(inst, prompt_style) for inst, _ in batch],
                                          max_tokens=max_tokens, temperature=temperature)
                new = [{**family.verdict_row(inst, res.text, res.completion_tokens,
                                             getattr(res, "finish_reason", None), criterion), "sample": s}
                       for (inst, s), res in zip(batch, results, strict=True)]
                journal.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new))
                journal.flush()
                os.fsync(journal.fileno())
                done.update(((str(r["id"]), r["sample"]), r) for r in new)
                if stop.stop_requested() and start + batch_size < len(todo):
                    raise stop.StageInterrupted(f"stopped while sampling {k} answers per question after "
                                                f"{start + len(batch)} of {len(todo)} (kept: resumed from there)")
    rows = [done[str(item_id(inst)), s] for inst, s in wanted]
    write_text_atomic(out_dir / ROWS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    write_text_atomic(out_dir / KEY_FILE, json.dumps(key, indent=2) + "\n")
    (out_dir / JOURNAL).unlink(missing_ok=True)
    return rows
