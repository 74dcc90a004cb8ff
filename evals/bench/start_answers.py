"""A warm start's greedy answers to an evaluation split, kept in the cache so that later benches of the same start
on the same machine do not answer again (`evals.bench.bench_learning`; each seed often runs in its own process).

Kept per (weights, split and its instance ids, answer limit, prompt style, sampler, CPU, torch, thread count): float32
kernels that sum in another order flip near-tied greedy tokens of this marginal policy, so answers computed
elsewhere are not reused. A kept answer is only text: it is verified again by `env.verify` on every reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from trainer.provenance import cpu_id


def spec(weights: dict, split: str, val: list, max_new: int, prompt_style: str, sampler: str = "generate") -> dict:
    """What a warm start's greedy answers to the evaluation split depend on: its weights, the instances, the answer
    limit and prompt, the sampler that answers (`trainer.filtered_sampling`: answers kept before it was named were
    transformers' generate) and the machine that computes them (CPU, torch, threads)."""
    import torch

    return {**({} if sampler == "generate" else {"sampler": sampler}), "weights": weights, "split": split, "ids": [x.id for x in val], "max_new_tokens": max_new,
            "prompt_style": prompt_style, "batch_size": 16, "cpu": cpu_id(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def path(spec: dict) -> Path:
    """`<cache>/start_answers/<sha256 of the spec, 16 digits>.json`, beside the warm starts."""
    from llm_backends.models import cache_root

    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / "start_answers" / f"{key}.json"


def cached(spec: dict, val: list) -> dict | None:
    """The start's figures from its kept answers, each verified again (`trainer.greedy.score_texts`), or None when none
    were kept for this spec, or the file is unreadable or names another spec (then the start answers again)."""
    from env.task import MapfTask
    from trainer.greedy import score_texts

    f = path(spec)
    try:
        kept = json.loads(f.read_text())
        if kept["spec"] != json.loads(json.dumps(spec)):
            return None
        texts = [x["answer"] for x in kept["answers"]]
        if [x["id"] for x in kept["answers"]] != [x.id for x in val]:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    r = score_texts(val, texts, MapfTask())
    r["eval_seconds"] = 0.0
    return r


def keep(spec: dict, r: dict) -> None:
    """Keep the start's greedy answers for `cached` (whole or not at all)."""
    f = path(spec)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f"{f.name}.{os.getpid()}.tmp")  # two benches of one start may both write it
    tmp.write_text(json.dumps({"spec": spec, "answers": [{"id": x["id"], "answer": x["answer"]} for x in r["answers"]],
                               "eval_seconds": r.get("eval_seconds")}, indent=2) + "\n")
    os.replace(tmp, f)
