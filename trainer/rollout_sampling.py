"""The token samplers of GRPO's CPU rollout copy (`trainer.grpo_trainer._rollout_decode`): the last logits processor
of a sampled generation, which draws each row's token itself and hands the loop a one-hot score.

- `InverseCdfSampling`: plain sampling from what the processors and warpers left, by inverse CDF.
- `BranchSampling` (`train.rollout_branch`): the greedy answer and its one-decision variants.
"""

from __future__ import annotations

import functools


def _draw(probs):
    """One token per row of `probs` (non-negative, rows need not sum to 1) by inverse CDF: the first token whose
    cumulative weight exceeds u * the row's total, u uniform. Returns the drawn indices, [rows, 1]. Overwrites
    `probs` with its cumulative sums (in place: a rollout's hot path, [rows, 49,152] a token)."""
    import torch

    cdf = probs.cumsum_(-1)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype).mul_(cdf[:, -1:])
    return torch.searchsorted(cdf, u, right=True).clamp_(max=probs.shape[-1] - 1)


@functools.cache
def _inverse_cdf_class():
    """`InverseCdfSampling`, built on first use so that importing this module needs no transformers."""
    from transformers import LogitsProcessor

    class InverseCdfSampling(LogitsProcessor):
        """The last logits processor of a sampled generation: draws each row's token itself, as a one-hot score.

        `torch.multinomial` draws one token by filling an exponential variate for every entry of the row
        (`exponential_`, then an argmax): 49,152 per row and token for SmolLM2, 12 % of a rollout's decode time on
        2 cores. The inverse of the cumulative distribution samples the same categorical with one uniform variate
        per row: the first token whose cumulative probability exceeds u * total. The scores that come in have been
        through every processor and warper transformers built from the generation config (temperature, top-k,
        top-p, ...); the scores that go out are 0 at the drawn token and -inf elsewhere, so the argmax of greedy
        selection picks it.
        """

        def __call__(self, input_ids, scores):
            import torch

            drawn = _draw(torch.softmax(scores, dim=-1, dtype=torch.float32))
            return torch.full_like(scores, float("-inf")).scatter_(1, drawn, 0.0)

    return InverseCdfSampling


@functools.cache
def _branch_class():
    """`BranchSampling`, built on first use so that importing this module needs no transformers."""
    from transformers import LogitsProcessor

    class BranchSampling(LogitsProcessor):
        """Rollouts that leave the greedy answer once (`train.rollout_branch`): the last processor of a sampled
        generation, in place of `InverseCdfSampling`.

        The first row of every group (of rows repeating one prompt, one after the other, as TRL and the screen lay
        them out) answers greedily: the group's anchor, the answer the greedy
        evaluation scores. Every other row follows the greedy answer too, until it leaves it: at each position where
        the sampling distribution (the scores as they come in, temperature and warpers applied) puts less than
        `confidence` on its top token, a row that has not left yet leaves with probability `rate`, on a token drawn
        from that distribution without its top token; from there on it is greedy again. So a group of 16 holds
        the greedy answer and up to 15 one-decision variants of it, and the group's advantages say which of the
        policy's uncertain decisions turned the greedy answer's verdict, on the answer greedy evaluation sees
        (sampled answers at T 0.7 are valid about half as often as greedy ones here, and a stage trained on them
        mostly learns where they stop: evals/results/learning_cpu). Tokens before a row's branch are the anchor's,
        so under the `dapo` loss they cancel across the rows that share them.

        Off the policy's own distribution: the losses score the tokens with the trained model as TRL does, and
        nothing corrects for the sampling (with one update per generation TRL's ratio is 1).
        """

        def __init__(self, rate: float, confidence: float, eos_token_id=None):
            self.rate, self.confidence = float(rate), float(confidence)
            eos = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
            self.eos = [int(t) for t in eos if t is not None]
            self.free = None  # rows that may still leave the greedy answer
            self.branched = 0  # rows that left it before their end of answer

        def __call__(self, input_ids, scores):
            import torch

            rows = scores.shape[0]
            if self.free is None:  # first call: the rows are their prompts, each group's rows one after the other
                self.free = torch.ones(rows, dtype=torch.bool)
                self.free[0] = False
                self.free[1:] = (input_ids[1:] == input_ids[:-1]).all(-1)  # a row unlike the one before: an anchor
            elif self.eos:  # transformers still scores a finished row (its token becomes padding): it cannot leave
                self.free &= ~torch.isin(input_ids[:, -1], torch.tensor(self.eos, device=input_ids.device))
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
            top_p, top = probs.max(-1)
            leave = self.free & (top_p < self.confidence) & (torch.rand(rows) < self.rate)
            out = torch.full_like(scores, float("-inf")).scatter_(1, top[:, None], 0.0)
            if leave.any():
                idx = leave.nonzero().squeeze(1)
                drawn = _draw(probs.index_select(0, idx).scatter_(1, top[idx, None], 0.0))  # without the top token
                out[idx] = torch.full_like(out[idx], float("-inf")).scatter_(1, drawn, 0.0)
                self.free &= ~leave
                self.branched += len(idx)
            return out

    return BranchSampling
