"""Prompt screening: train a GRPO stage only on the instances where the policy is sometimes right.

A GRPO group whose completions all score the same teaches nothing. With the 135M policy most of a stage's
instances are out of its reach (every sample invalid) and a few are always solved alike, so most groups carry no
signal, and dynamic sampling (`trainer.grpo_trainer`) finds a replacement for only some of them. Screening asks
before the stage instead: every instance of the stage's set is answered `samples` times, sampled exactly as GRPO
will sample it (the same rollout copy, temperature, top-p/top-k and answer limit), each answer is scored by the
stage's own reward, and only the instances whose answers did not all score alike are kept. Those are the prompts
"where the policy is sometimes right" (issue 16); GRPO's first draw of every batch then comes from them, and so
do dynamic sampling's replacements.

The engineer's proposal still decides which instances exist (sizes, holes, waits, shares); screening only drops
the ones that would teach nothing now. When fewer than `min_keep` instances pass, the whole set is kept (a stage
whose every instance is out of reach trains as it did without screening) and the metrics say so.

The choice is written to `screen.json` in the stage folder and read back when the stage resumes, so a resumed
stage trains on the same rows without screening again.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCREEN_FILE = "screen.json"


def informative(rewards: list[float], eps: float = 1e-9) -> bool:
    """Whether a group of rewards has variance (not all equal), the GRPO condition for a non-zero advantage."""
    return bool(rewards) and max(rewards) - min(rewards) > eps


def sample_answers(model, tokenizer, prompts: list[list[dict]], *, samples: int, generation_config,
                   template_kwargs: dict | None = None, prompts_per_call: int = 8) -> list[list[tuple[str, list[int]]]]:
    """`samples` sampled answers (text, token ids up to and including the first EOS) to each chat prompt.

    Prompts are left-padded and each row is repeated `samples` times in one `generate` call of up to
    `prompts_per_call` prompts, as TRL repeats a prompt for its group."""
    import torch

    eos = generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) - {None}
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[list[tuple[str, list[int]]]] = []
    try:
        for i in range(0, len(prompts), prompts_per_call):
            chunk = prompts[i:i + prompts_per_call]
            texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False,
                                                   **(template_kwargs or {})) for p in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            ids = enc["input_ids"].repeat_interleave(samples, 0)
            mask = enc["attention_mask"].repeat_interleave(samples, 0)
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config)
            for p in range(len(chunk)):
                group = []
                for row in gen[p * samples:(p + 1) * samples, ids.shape[1]:].tolist():
                    cut = next((j for j, t in enumerate(row) if t in eos), None)
                    row = row if cut is None else row[:cut + 1]
                    group.append((tokenizer.decode(row, skip_special_tokens=True), row))
                out.append(group)
    finally:
        tokenizer.padding_side = side
    return out


def screen_dataset(dataset, *, model, tokenizer, reward, samples: int, generation_config, min_keep: int = 4,
                   prompts_per_call: int = 8, template_kwargs: dict | None = None,
                   progress: bool = False) -> tuple[list[int], dict[str, Any]]:
    """The rows of `dataset` (`trainer.data.build_dataset`'s) worth training on, and the screen's figures.

    `reward` is called as TRL calls a reward function (`completions`, `completion_ids`, `instance`), once over
    every answer; pass a reward of its own (a fresh `MapfReward` on the stage's reward state), since it updates
    its state and history. Returns (kept row indices in dataset order, stats)."""
    from trainer.data import row_size

    t0 = time.perf_counter()
    rows = list(dataset)
    answers = sample_answers(model, tokenizer, [r["prompt"] for r in rows], samples=samples,
                             generation_config=generation_config, template_kwargs=template_kwargs,
                             prompts_per_call=prompts_per_call)
    flat = [a for group in answers for a in group]
    rewards = reward(completions=[t for t, _ in flat], completion_ids=[ids for _, ids in flat],
                     instance=[r["instance"] for r in rows for _ in range(samples)])
    by_size: dict[int, list[int]] = {}
    keep: list[int] = []
    for i, r in enumerate(rows):
        group = rewards[i * samples:(i + 1) * samples]
        st = by_size.setdefault(row_size(r), [0, 0])
        st[1] += 1
        if informative(group):
            keep.append(i)
            st[0] += 1
    valid = [h["valid_rate"] * len(h["rewards"]) for h in getattr(reward, "history", [])]
    stats = {
        "candidates": len(rows),
        "informative": len(keep),
        "samples": samples,
        "fallback": len(keep) < min_keep,
        "informative_by_size": {str(s): v[0] for s, v in sorted(by_size.items())},
        "candidates_by_size": {str(s): v[1] for s, v in sorted(by_size.items())},
        "sampled_valid_rate": sum(valid) / len(flat) if valid and flat else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    if stats["fallback"]:
        keep = list(range(len(rows)))
    stats["kept"] = len(keep)
    if progress:
        log.info("screen: %d of %d instances have reward variance in %d samples (%s)%s, %.0f s",
                 stats["informative"], len(rows), samples, stats["informative_by_size"],
                 f"; fewer than {min_keep}: all kept" if stats["fallback"] else "", stats["seconds"])
    return keep, stats


def screen_metrics(stats: dict | None) -> dict[str, Any]:
    """`train/screen_*` figures of a stage (empty when the stage was not screened)."""
    if not stats:
        return {}
    return {
        "train/screen_candidates": stats["candidates"],
        "train/screen_informative": stats["informative"],
        "train/screen_kept": stats["kept"],
        "train/screen_fallback": stats["fallback"],
        "train/screen_sampled_valid_rate": stats["sampled_valid_rate"],
        "train/screen_seconds": stats["seconds"],
        "train/screen_informative_by_size": stats["informative_by_size"],
    }


def load_screen(out_dir: Path, key: str, n_rows: int) -> tuple[list[int], dict] | None:
    """A finished screen of this very stage (`key`: `trainer.resume.stage_key`), or None."""
    path = Path(out_dir) / SCREEN_FILE
    try:
        saved = json.loads(path.read_text())
        keep = [int(i) for i in saved["keep"]]
        if saved.get("key") != key or not keep or any(not 0 <= i < n_rows for i in keep):
            return None
        return keep, dict(saved["stats"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_screen(out_dir: Path, key: str, keep: list[int], stats: dict) -> None:
    from trainer.files import write_text_atomic

    write_text_atomic(Path(out_dir) / SCREEN_FILE, json.dumps({"key": key, "keep": keep, "stats": stats}) + "\n")
