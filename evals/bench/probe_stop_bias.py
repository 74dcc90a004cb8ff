"""Is what a short GRPO stage changes in the greedy answers only where they stop? A stage-free stand-in, compared.

    python -m evals.bench.probe_stop_bias --bias 0.5,1,2 --runs evals/results/learning_cpu/bench_learning_s4*.json
    python -m evals.bench.probe_stop_bias --bias "" --sampled 8   # only: how long are sampled answers, by verdict

The cached warm start answers `val-small` (sizes 3-5) greedily, as `bench_learning` scores it, once as it is and
once per `--bias` b with b added to the logit of the line end ("\\n") wherever a cell has just been closed (")"):
the start made to end each agent's path sooner, and nothing else. For each bias: the valid rate, the failures,
the answers' mean length, and which instances flipped against the unbiased start. With `--runs` (bench_learning
JSON files from the same start, with per-instance `diffs`), how those flips agree with the flips of every trained
seed: a stage that only shortens the answers flips the same instances as some bias does. With `--sampled K`, first:
K answers sampled at the preset's temperature to each of the 24 instances seed 0 of `bench_learning` trains on,
their mean length in tokens by verdict (which answers a GRPO group scores higher, and how long they are).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

LINE_END, CELL_CLOSE = "\n", ")"


class StopBias:
    """A `LogitsProcessor`: add `bias` to the line end's logit in every row whose last token closes a cell."""

    def __init__(self, tokenizer, bias: float):
        (self.end,) = tokenizer(LINE_END, add_special_tokens=False)["input_ids"]
        (self.close,) = tokenizer(CELL_CLOSE, add_special_tokens=False)["input_ids"]
        self.bias = bias

    def __call__(self, input_ids, scores):
        rows = input_ids[:, -1] == self.close
        scores[rows, self.end] += self.bias
        return scores


def agreement(flips: list[int], runs: list[list[int]]) -> dict:
    """How the bias's flips (-1, 0, +1 per instance) line up with each trained seed's: the share of the seeds'
    flipped instances the bias flips the same way, and the share of the bias's flips the seeds share on average."""
    same = sum(1 for d in runs for a, b in zip(flips, d, strict=True) if b and a == b)
    seeds_flipped = sum(1 for d in runs for b in d if b)
    mine = sum(1 for a in flips if a)
    return {"seed_flips_matched": same / seeds_flipped if seeds_flipped else float("nan"),
            "bias_flips_shared": same / (mine * len(runs)) if mine and runs else float("nan")}


def sampled_lengths(model, tok, cfg, k: int) -> dict:
    """`k` answers sampled at `cfg.temperature` (no top-k, no top-p, as GRPO samples) to each of bench_learning's
    seed-0 training instances: {verdict ("valid", a failure, or "truncated" at the token limit): {n, tokens}}."""
    import torch

    from env import verify
    from env.library import prompt_messages
    from evals.bench.bench_learning import training_draw

    insts = training_draw({3, 4, 5}, 24, seed=0)  # what bench_learning's seed 0 trains on
    torch.manual_seed(0)
    tok.padding_side = "left"
    by: dict[str, list[int]] = {}
    for i in range(0, len(insts), 4):
        chunk = insts[i : i + 4]
        texts = [tok.apply_chat_template(prompt_messages(x, cfg.prompt_style), add_generation_prompt=True,
                                         tokenize=False) for x in chunk for _ in range(k)]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=cfg.max_completion_length, do_sample=True, top_k=0, top_p=1.0,
                                 temperature=cfg.temperature, pad_token_id=tok.pad_token_id)
        for j, ids in enumerate(gen[:, enc["input_ids"].shape[1] :]):
            n = int((ids != tok.pad_token_id).sum())
            v = verify(chunk[j // k], tok.decode(ids, skip_special_tokens=True))
            by.setdefault("truncated" if n >= cfg.max_completion_length else (v.failure or "valid"), []).append(n)
    return {key: {"n": len(v), "tokens": statistics.fmean(v)} for key, v in sorted(by.items(), key=lambda t: -len(t[1]))}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bias", default="0.5,1,2", help="line-end logit biases to try (comma list; 0 is always run)")
    p.add_argument("--runs", type=Path, nargs="*", default=[], metavar="JSON",
                   help="bench_learning files whose seeds' per-instance flips to compare with")
    p.add_argument("--sampled", type=int, default=0, metavar="K",
                   help="first sample K answers per training instance and print their length by verdict (0: off)")
    p.add_argument("--warm-seed", type=int, default=0)
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="answer with this checkpoint (e.g. a seed kept by bench_learning --keep-checkpoints) instead "
                   "of the warm start (not with --runs)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = p.parse_args(argv)
    try:
        biases = [float(x) for x in a.bias.split(",") if x.strip()]
    except ValueError:
        p.error(f"--bias {a.bias!r}: expected a comma list of numbers, e.g. 0.5,1,2")
    if a.sampled < 0:
        p.error(f"--sampled {a.sampled}: expected 0 (off) or a number of answers per instance")
    if a.runs and a.checkpoint:
        p.error("--runs with --checkpoint: the seeds' flips are against the warm start, this checkpoint's would not be")
    files = {}
    for f in a.runs:  # read before any model work: a bad file stops the probe at once
        try:
            files[f] = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            p.error(f"--runs {f}: not a readable bench_learning JSON file ({e})")

    from transformers import LogitsProcessorList

    from env import load_split
    from env.task import MapfTask
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.greedy import greedy_valid_rate
    from trainer.sft import build_warm_start, warm_start_levels

    task = MapfTask()
    cfg = TrainConfig.model_validate(TRAIN_PRESETS["cpu"])
    ws = build_warm_start(resolve_model("smollm2-135m"), cfg, a.warm_seed, warm_start_levels(task, cfg), task=task)
    runs = []
    for f, d in files.items():
        if not isinstance(d, dict) or d.get("warm_start", {}).get("weights") != ws["weights"] or d.get("instances") != 150:
            p.error(f"--runs {f}: not a 150-answer bench from this warm start's weights ({ws['path']})")
        runs += [s["diffs"] for s in d["seeds"] if len(s.get("diffs") or []) == 150]
    val = [i for s in (3, 4, 5) for i in load_split("val-small") if i.size == s]
    model, tok = load_checkpoint(a.checkpoint or ws["path"])

    def score(bias: float) -> dict:
        extra = {"logits_processor": LogitsProcessorList([StopBias(tok, bias)])} if bias else {}
        r = greedy_valid_rate(model, tok, val, max_new_tokens=cfg.max_completion_length, batch_size=16,
                              prompt_style=cfg.prompt_style, task=task, **extra)
        tokens = [len(tok(x["answer"], add_special_tokens=False)["input_ids"]) for x in r["answers"]]
        return {"bias": bias, "valid_rate": r["valid_rate"], "failures": r["failures"],
                "answer_tokens": statistics.fmean(tokens), "valid": r["valid"]}

    if a.sampled:
        out_sampled = sampled_lengths(model, tok, cfg, a.sampled)
        print(f"sampled at T {cfg.temperature}: " + ", ".join(
            f"{k} {v['n']} ({v['tokens']:.1f} tokens)" for k, v in out_sampled.items()), flush=True)
    base = score(0.0)
    print(f"bias 0: valid {base['valid_rate']:.3f}, {base['answer_tokens']:.1f} tokens, {base['failures']}", flush=True)
    if runs:
        seeds = [sum(d) / 150 for d in runs]
        print(f"{len(runs)} trained seeds: mean gain {100 * statistics.fmean(seeds):+.1f} points, "
              f"{statistics.fmean(sum(1 for x in d if x) for d in runs):.1f} instances flipped per seed", flush=True)
    out = {"warm_start": ws["key"], "checkpoint": str(a.checkpoint) if a.checkpoint else None,
           "seeds_compared": len(runs), "biases": [base],
           **({"sampled": out_sampled} if a.sampled else {})}
    def save() -> None:  # after every evaluation: a stopped probe keeps what it measured
        if a.json:
            a.json.write_text(json.dumps(out, indent=1) + "\n")

    save()
    for b in biases:
        r = score(b)
        flips = [int(x) - int(y) for x, y in zip(r["valid"], base["valid"], strict=True)]
        r.update({"gain": r["valid_rate"] - base["valid_rate"], "flips": flips,
                  "gained": sum(1 for x in flips if x > 0), "lost": sum(1 for x in flips if x < 0),
                  **(agreement(flips, runs) if runs else {})})
        out["biases"].append(r)
        print(f"bias {b:g}: valid {r['valid_rate']:.3f} ({100 * r['gain']:+.1f}), {r['answer_tokens']:.1f} tokens, "
              f"+{r['gained']} -{r['lost']}, {r['failures']}"
              + (f"; of the seeds' flips {100 * r['seed_flips_matched']:.0f} % are the bias's too, of the bias's "
                 f"{100 * r['bias_flips_shared']:.0f} % are a seed's" if runs else ""), flush=True)
        save()
    return out


if __name__ == "__main__":
    main()
