"""A stage that ends on its best weights, not its last (`train.select_instances`, `train.select_every`).

At CPU scale one 24-step GRPO stage moves the policy's greedy answers far in either direction from seed to seed
(evals/results/learning_cpu: -10 to +6 points from the same start). With `select_instances` N > 0 the stage holds
N of its own instances out of training (`hold_out`: a seeded draw, every grid size in proportion), answers them
greedily with the trained model at its start and every `select_every` optimiser steps (`SelectBest`, a
transformers `TrainerCallback`), keeps a copy of the trainable weights whenever more answers are valid than at any
earlier check, and ends on that copy: the earliest best, the start included, so a stage that only made the policy
worse leaves it as it was. Early stopping on held-out instances of the stage's own distribution: the evaluation
split is never seen.

transformers' own `load_best_model_at_end` does not fit here: it writes a full checkpoint to disk at every
evaluation, and a GRPO trainer's `evaluate` scores sampled completions by reward, not greedy answers by validity.

The copies live in memory (the trainable parameters only: 540 MB for every block of SmolLM2-135M in float32, the
adapters alone with LoRA). A stage resumed from an in-stage checkpoint (`save_steps`) selects among the checks made
after it resumed; the checks before the crash are not kept.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from transformers import TrainerCallback

log = logging.getLogger(__name__)


def hold_out(instances: list, n: int, seed: int) -> tuple[list, list]:
    """(the instances to train on, the `n` held out to select with): within each grid size a seeded draw of its
    share of `n` (largest remainders), so the held-out set has the stage's mix of sizes; both keep file order.
    ValueError unless `n` is below the number of instances."""
    if n <= 0:
        return list(instances), []
    if n >= len(instances):
        raise ValueError(f"train.select_instances={n}: the stage's file holds {len(instances)} instances, and at "
                         "least one must be left to train on; allowed: fewer than the stage's instances (the loop "
                         "generates instances_per_stage + select_instances per stage)")
    by_size: dict[int, list[int]] = {}
    for i, x in enumerate(instances):
        by_size.setdefault(x.size, []).append(i)
    exact = {s: n * len(ix) / len(instances) for s, ix in by_size.items()}
    take = {s: int(q) for s, q in exact.items()}
    for s in sorted(exact, key=lambda s: (int(exact[s]) - exact[s], s))[: n - sum(take.values())]:
        take[s] += 1
    rng = random.Random(seed)
    held = {i for s, ix in sorted(by_size.items()) for i in rng.sample(ix, take[s])}
    return [x for i, x in enumerate(instances) if i not in held], [x for i, x in enumerate(instances) if i in held]


def greedy_scorer(instances: list, tok, *, max_new_tokens: int, prompt_style: str) -> Callable:
    """model -> share of `instances` it answers validly, greedy and in-process (`trainer.sft.greedy_valid_rate`, the
    same answering as bench_learning's evaluation)."""
    from trainer.sft import greedy_valid_rate

    def score(model) -> float:
        return greedy_valid_rate(model, tok, instances, max_new_tokens=max_new_tokens, batch_size=16,
                                 prompt_style=prompt_style)["valid_rate"]

    return score


class SelectBest(TrainerCallback):
    """Score the model at the start of training, every `every` optimiser steps and at the last step; keep the
    trainable weights of the first best score and load them back when training ends.

    `history`: one {step, valid_rate, seconds} per check. `best_step`, `best_rate`: what the stage ended on.
    `last_weights`: with `keep_last`, the trainable weights of the last step when an earlier step was chosen (for a
    side-by-side evaluation of both; None otherwise)."""

    def __init__(self, score: Callable, every: int, *, keep_last: bool = False) -> None:
        self.score, self.every, self.keep_last = score, int(every), keep_last
        self.history: list[dict] = []
        self.best_step: int | None = None
        self.best_rate = -1.0
        self.best: dict | None = None
        self.last_weights: dict | None = None
        self.seconds = 0.0

    @staticmethod
    def _trainable(model) -> dict:
        return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}

    def check(self, model, step: int) -> None:
        from trainer.stop import stop_requested

        # checked already, or a stop was asked for (the stage ends unsaved and resumes later: no minute of answers)
        if (self.history and self.history[-1]["step"] == step) or stop_requested():
            return
        t = time.perf_counter()
        rate = float(self.score(model))
        if rate > self.best_rate:
            self.best_rate, self.best_step, self.best = rate, step, self._trainable(model)
        dt = time.perf_counter() - t
        self.seconds += dt
        self.history.append({"step": step, "valid_rate": rate, "seconds": round(dt, 1)})
        log.info("select: step %d answers %.1f %% of its held-out instances validly (best %.1f %% at step %d)",
                 step, 100 * rate, 100 * self.best_rate, self.best_step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.check(model, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
            self.check(model, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        import torch

        from trainer.stop import stop_requested

        if stop_requested():  # the stage ends unsaved and resumes later: nothing to choose or restore
            return
        self.check(model, state.global_step)  # a stage ended between checks: its last weights are a candidate
        if self.best_step == state.global_step:
            return
        if self.keep_last:
            self.last_weights = self._trainable(model)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in self.best.items():
                params[name].copy_(value)
        log.info("select: the stage ends on step %d's weights (%.1f %% valid), not step %d's (%.1f %%)",
                 self.best_step, 100 * self.best_rate, state.global_step, 100 * self.history[-1]["valid_rate"])

    def metrics(self) -> dict:
        """`train/select_*`: what was chosen, the start's and the last check's scores, every check, the seconds."""
        if not self.history:
            return {}
        return {
            "train/select_step": self.best_step,
            "train/select_valid_rate": self.best_rate,
            "train/select_start_valid_rate": self.history[0]["valid_rate"],
            "train/select_last_valid_rate": self.history[-1]["valid_rate"],
            "train/select_history": self.history,
            "train/select_seconds": round(self.seconds, 1),
        }
