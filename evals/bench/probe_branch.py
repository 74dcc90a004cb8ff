"""What branched rollouts (`train.rollout_branch`) sample, against plain sampling, from one policy.

`python -m evals.bench.probe_branch --instances 16 --branch 0.15:0.9,0.3:0.9,1:0.9`: the preset's cached warm start
(`ENV_ENGINEER_CACHE`) answers a GRPO seed's training draw of N instances (`bench_learning.training_draw`) 16 times
each with the bf16 rollout copy at the preset's temperature (no top-k, as TRL samples), once with plain sampling and once per
RATE:CONFIDENCE pair with `trainer.rollout_sampling.BranchSampling`. Printed per sampler: the share of valid answers, the
share of groups whose first answer is valid (with branching: the greedy answer), the groups with reward variance
(the preset's reward with partial credit 0.25), the groups where some answer outscores the first, the distinct
answers per group, and the rows that left the greedy answer. No training; a few minutes per sampler on 2 cores.
"""

from __future__ import annotations

import argparse
import time


def parse_branches(text: str) -> list[tuple[float, float]]:
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        try:
            rate, conf = (float(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"--branch {part!r}: allowed: RATE:CONFIDENCE pairs, e.g. 0.15:0.9") from None
        if not (0 < rate <= 1 and 0 < conf <= 1):
            raise ValueError(f"--branch {part!r}: allowed: a rate in (0, 1] and a confidence in (0, 1]")
        out.append((rate, conf))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=16, help="training instances answered (default 16)")
    p.add_argument("--samples", type=int, default=16, help="answers per instance, one group (default 16)")
    p.add_argument("--seed", type=int, default=0, help="the GRPO seed whose training draw is answered")
    p.add_argument("--branch", default="0.15:0.9", help="RATE:CONFIDENCE pairs, comma-separated")
    p.add_argument("--partial-credit", type=float, default=0.25, help="the reward's partial credit (default 0.25)")
    a = p.parse_args(argv)
    try:
        branches = parse_branches(a.branch)
    except ValueError as e:
        p.error(str(e))

    import torch
    from transformers import GenerationConfig

    from evals.bench.bench_learning import training_draw
    from llm_backends.checkpoints import load_checkpoint
    from llm_backends.models import resolve_model
    from trainer.config import TRAIN_PRESETS, TrainConfig
    from trainer.data import MapfReward, build_dataset
    from trainer.grpo_trainer import RolloutCopy
    from trainer.screen import sample_answers
    from trainer.sft import build_warm_start

    cfg = TrainConfig.model_validate(TRAIN_PRESETS["cpu"])
    ws = build_warm_start(resolve_model("smollm2-135m"), cfg, 0)
    model, tok = load_checkpoint(ws["path"])
    rows = list(build_dataset(training_draw({3, 4, 5}, a.instances, a.seed), tok, cfg.max_prompt_length,
                              cfg.prompt_style)[0])
    gc = GenerationConfig(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0,
                          max_new_tokens=cfg.max_completion_length, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
    g = a.samples
    print(f"start {ws['path']} ({ws['key']}); {len(rows)} instances x {g} answers, T {cfg.temperature}")
    for branch in [None, *branches]:
        torch.manual_seed(0)
        sampler = RolloutCopy("bfloat16", branch).synced(model, 0)
        t = time.perf_counter()
        answers = sample_answers(sampler, tok, [r["prompt"] for r in rows], samples=g, generation_config=gc)
        seconds = time.perf_counter() - t
        reward = MapfReward(tok, None, cfg.prompt_style, cfg.optimality, a.partial_credit, cfg.partial_credit_kind)
        flat = [x for group in answers for x in group]
        r = reward(completions=[x for x, _ in flat], completion_ids=[i for _, i in flat],
                   instance=[row["instance"] for row in rows for _ in range(g)])
        groups = [r[i * g:(i + 1) * g] for i in range(len(rows))]
        valid = sum(x >= 0.3 for x in r) / len(r)
        print(f"{'plain' if branch is None else f'branch {branch[0]}:{branch[1]}':<16} "
              f"valid {valid:.3f}  first valid {sum(x[0] >= 0.3 for x in groups) / len(groups):.3f}  "
              f"variance {sum(max(x) - min(x) > 1e-9 for x in groups)}/{len(groups)}  "
              f"above the first {sum(max(x) > x[0] + 1e-9 for x in groups)}/{len(groups)}  "
              f"distinct/group {sum(len({tuple(i) for _, i in x}) for x in answers) / len(answers):.1f}  "
              f"left {getattr(sampler, 'rollout_branched', '-')}  {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
