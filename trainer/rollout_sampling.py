"""The token samplers of GRPO's CPU rollout copy (`trainer.grpo_trainer._rollout_decode`): the last logits processor
of a sampled generation, which draws each row's token itself and hands the loop a one-hot score.

- `InverseCdfSampling`: plain sampling from what the processors and warpers left, by inverse CDF.
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
