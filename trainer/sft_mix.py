"""An SFT term in GRPO's loss: the solver's optimal answers to the stage's own instances, as an anchor.

Why (issue 16, stop 41): on the 135M policy's solvable training instances the valid answers are the short direct
paths and the invalid ones wander into holes, so GRPO rewards "short" and the policy carries it over to every map
as stopping one or two cells before the goal (`goal_not_reached` 18 -> 23-44 after a 24-step stage, whatever the
loss type or a KL anchor). The solver's plan of the same instance is short *because* it is direct and it always
ends on the goal; a likelihood term on it tells the two apart at training time.

With `train.sft_mix` = lambda > 0 every micro-batch's loss becomes

    GRPO loss + lambda * (mean negative log-likelihood per answer token of `sft_mix_batch` solver answers)

(divided by the gradient-accumulation steps as TRL divides its own). The answers are those of the stage's own
training instances, drawn with a seeded RNG, each written exactly as the warm start writes it
(`trainer.data.format_answer`) and ended with the tokenizer's EOS, as a GRPO completion ends; they are scored
by the trainer's own `_get_per_token_logps_and_entropies` (left-padded prompt, right-padded answer, only the answer
positions), the path GRPO's own loss takes. Instances that share their layout with an evaluation split are left
out (small maps have few layouts), so the term never trains on an answer the evaluation scores. Not in the paper.
"""

from __future__ import annotations

import random
from typing import Any


def sft_examples(instances: list, tokenizer, prompt_style: str = "compact",
                 template_kwargs: dict | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) of every instance whose layout is in no evaluation split, in order.

    The prompt is the chat-templated policy prompt with the generation prompt, as TRL feeds it; the answer is the
    solver's optimal plan (`format_answer`), as the warm start trains it."""
    from env.library import prompt_messages
    from trainer.data import _eval_layouts, _layout, format_answer, prompt_ids

    if tokenizer.eos_token_id is None:
        raise ValueError("sft_mix: the tokenizer has no EOS token to end the solver's answers with")
    held_out = _eval_layouts()
    out = []
    for inst in instances:
        if _layout(inst) in held_out:
            continue
        prompt = prompt_ids(tokenizer, prompt_messages(inst, prompt_style), template_kwargs)
        answer = tokenizer(format_answer(inst), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append((prompt, answer))
    return out


def batch_tensors(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    """GRPO's layout for `examples`: prompts left-padded, answers right-padded, one attention mask over both, and
    the answers' mask; `logits_to_keep` = the longest answer.

    >>> b = batch_tensors([([1, 2], [7, 8, 9]), ([3], [6])], pad_id=0)
    >>> b["input_ids"].tolist(), b["answer_mask"].tolist(), b["logits_to_keep"]
    ([[1, 2, 7, 8, 9], [0, 3, 6, 0, 0]], [[1, 1, 1], [1, 0, 0]], 3)
    """
    import torch

    p_len = max(len(p) for p, _ in examples)
    a_len = max(len(a) for _, a in examples)
    ids, attn, amask = [], [], []
    for p, a in examples:
        ids.append([pad_id] * (p_len - len(p)) + p + a + [pad_id] * (a_len - len(a)))
        attn.append([0] * (p_len - len(p)) + [1] * (len(p) + len(a)) + [0] * (a_len - len(a)))
        amask.append([1] * len(a) + [0] * (a_len - len(a)))
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(attn),
            "answer_mask": torch.tensor(amask), "logits_to_keep": a_len}


class SftMix:
    """Draws `batch` solver answers per call from `examples` (seeded) and scores their mean NLL per answer token
    with `score(model, input_ids, attention_mask, logits_to_keep) -> (per-token logps, ...)`."""

    def __init__(self, examples: list[tuple[list[int], list[int]]], *, weight: float, batch: int, seed: int,
                 pad_id: int):
        if weight > 0 and not examples:
            raise ValueError("sft_mix > 0 but none of the stage's instances can be used (every one shares its layout "
                             "with an evaluation split); set train.sft_mix=0 or give the stage other instances")
        self.examples, self.weight, self.batch, self.pad_id = examples, float(weight), int(batch), pad_id
        self._rng = random.Random(seed + 7_331)
        self.calls, self.nll_sum, self.tokens = 0, 0.0, 0

    def draw(self) -> list[tuple[list[int], list[int]]]:
        k = min(self.batch, len(self.examples))
        return self._rng.sample(self.examples, k)

    def nll(self, score, model, device) -> Any:
        """Mean negative log-likelihood per answer token of one fresh draw (a tensor with a gradient)."""
        b = batch_tensors(self.draw(), self.pad_id)
        ids, attn, mask = (b[k].to(device) for k in ("input_ids", "attention_mask", "answer_mask"))
        logps = score(model, ids, attn, b["logits_to_keep"])[0]
        n = mask.sum()
        nll = -(logps * mask).sum() / n.clamp(min=1)
        self.calls += 1
        self.nll_sum += float(nll.detach())
        self.tokens += int(n)
        return nll

    def metrics(self) -> dict[str, float]:
        """`train/sft_mix_*` figures of the stage."""
        return {"train/sft_mix_weight": self.weight, "train/sft_mix_examples": len(self.examples),
                "train/sft_mix_batches": self.calls,
                "train/sft_mix_nll": self.nll_sum / self.calls if self.calls else float("nan")}
