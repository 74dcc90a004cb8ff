"""Credit localized by the verifier (`train.localize_credit`): restrict each invalid GRPO answer's loss by where it
first went wrong (`env.verify.first_error`), through TRL's per-token `tool_mask`. Not in the paper; off by default.
Measured in evals/results/learning_cpu (stop 44): it stops the answers shortening, without raising the greedy valid
rate. Also each sign of advantage weighed on its own (`train.positive_weight`, `train.negative_weight`, stop 47), and
`Credit`: everything the trainer does to a batch's credit once it is sampled (these two and `trainer.step_credit`)."""

from __future__ import annotations


def localize_credit(batch: dict, rows: list[dict], tok, counts: dict | None = None) -> dict:
    """`batch` with the loss of each invalid answer restricted by where it first went wrong
    (`env.verify.first_error`, the token holding that character): an answer scored below its group (negative
    advantage) is pushed down on that token only, so neither the sound tokens before it nor the tokens it wrote
    once off course are taught against (a " (" that opens any next cell is pushed down only where it is the error);
    one scored above its group (positive, e.g. by partial credit) is pushed up only before it, so the error is not
    taught. Valid answers, answers whose error has no place (parse errors), zero advantages, and answers below their
    group whose first error is stopping short of a goal keep their whole loss: pushing down the line break that
    ended a path alone moved its mass onto closing the answer early (14 of 150 answers naming the wrong number of
    agents after one 24-step stage, stop 44).

    The restriction is TRL's per-token `tool_mask` (the loss mask is completion_mask x tool_mask; attention keeps
    completion_mask), and `num_items_in_batch` is left as it was: a masked token's term is dropped, the others keep
    their weight. `rows`: the batch's dataset rows in order (their `instance` column); `counts`: running totals
    (rows, localized_rows, tokens, masked_tokens), updated in place."""
    import torch

    from env import Instance
    from env.verify import first_error

    ids, mask, adv = batch["completion_ids"], batch["completion_mask"], batch["advantages"]
    if len(rows) != ids.shape[0]:
        raise ValueError(f"localize_credit: {len(rows)} rows for a batch of {ids.shape[0]} completions")
    keep = batch.get("tool_mask")
    keep = torch.ones_like(mask) if keep is None else keep.clone()
    instances: dict[str, Instance] = {}
    localized = 0
    for b, row in enumerate(rows):
        a = float(adv[b])
        if a == 0.0:
            continue
        raw = row["instance"]
        inst = instances.get(raw) or instances.setdefault(raw, Instance.from_json(raw))
        n = int(mask[b].sum())
        tokens = ids[b, :n].tolist()
        text = tok.decode(tokens, skip_special_tokens=True)
        error = first_error(inst, text)
        if error is None or (a < 0 and error[1] == "goal_not_reached"):
            continue
        at = error[0]
        k = _token_at(tok, tokens, at)
        if a < 0:
            keep[b, :k] = 0
            keep[b, k + 1:] = 0
        else:
            keep[b, k:] = 0
        localized += 1
    loss_mask = mask * keep
    if counts is not None:
        counts["rows"] = counts.get("rows", 0) + len(rows)
        counts["localized_rows"] = counts.get("localized_rows", 0) + localized
        counts["tokens"] = counts.get("tokens", 0) + int(mask.sum())
        counts["masked_tokens"] = counts.get("masked_tokens", 0) + int(mask.sum() - loss_mask.sum())
    return {**batch, "tool_mask": keep}


def _token_at(tok, tokens: list[int], offset: int) -> int:
    """The index of the token of `tokens` whose decoded text holds character `offset` of their decoded text
    (len(tokens) if the text is shorter): the first k with len(decode(tokens[:k + 1])) > offset."""
    lo, hi = 0, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tok.decode(tokens[: mid + 1], skip_special_tokens=True)) > offset:
            hi = mid
        else:
            lo = mid + 1
    return lo


def localize_metrics(counts: dict) -> dict[str, float]:
    """`train/...` figures of a stage's localized credit (`LocalizedCredit.counts`)."""
    rows, tokens = counts.get("rows", 0), counts.get("tokens", 0)
    return {
        "train/localized_rows": counts.get("localized_rows", 0) / rows if rows else float("nan"),
        "train/localized_tokens_masked": counts.get("masked_tokens", 0) / tokens if tokens else float("nan"),
    }


class LocalizedCredit:
    """`localize_credit` over a stage's batches (the trainer calls it on every generation batch it trains on), with
    its running counts."""

    def __init__(self):
        self.counts = {"rows": 0, "localized_rows": 0, "tokens": 0, "masked_tokens": 0}

    def __call__(self, batch: dict, rows: list[dict], tok) -> dict:
        return localize_credit(batch, rows, tok, self.counts)

    def metrics(self) -> dict[str, float]:
        return localize_metrics(self.counts)


def weigh_advantages(batch: dict, positive: float, negative: float) -> dict:
    """`batch` with every positive advantage (an answer scored above its group) times `positive` and every negative
    one times `negative` (`train.positive_weight`, `train.negative_weight`; 1 and 1: unchanged)."""
    if positive == 1.0 and negative == 1.0:
        return batch
    adv = batch["advantages"]
    return {**batch, "advantages": adv.where(adv >= 0, adv * negative).where(adv <= 0, adv * positive)}


class Credit:
    """What `DynamicSamplingGRPOTrainer` does to the credit of every batch it trains on, after dynamic sampling:
    each sign of advantage weighed (`weigh_advantages`), then each invalid answer's loss localized
    (`LocalizedCredit`) or each step credited (`trainer.step_credit`); with the defaults, nothing."""

    def __init__(self, weights=(1.0, 1.0), localize: bool = False, step: float = 0.0, group_size: int = 1,
                 idle: float = 0.0):
        if localize and step:
            raise ValueError("localize_credit and step_credit both place credit inside an answer: choose one")
        self.weights = tuple(map(float, weights))
        self.localizer = LocalizedCredit() if localize else None
        self.step, self.group_size, self.idle = float(step), int(group_size), float(idle)
        self.step_counts: dict = {"answers": 0, "steps": 0, "bad_steps": 0, "tokens": 0}

    @classmethod
    def from_config(cls, cfg) -> Credit:
        return cls((cfg.positive_weight, cfg.negative_weight), cfg.localize_credit, cfg.step_credit, cfg.num_generations,
                   cfg.step_credit_idle)

    def __call__(self, batch: dict, rows: list[dict], tok) -> dict:
        batch = weigh_advantages(batch, *self.weights)
        if self.localizer is not None:
            batch = self.localizer(batch, rows, tok)
        if self.step:
            from trainer.step_credit import step_credit

            batch = step_credit(batch, rows, tok, self.step, self.group_size, self.step_counts, idle=self.idle)
        return batch

    def metrics(self) -> dict[str, float]:
        from trainer.step_credit import step_credit_metrics

        return {**(self.localizer.metrics() if self.localizer is not None else {}),
                **(step_credit_metrics(self.step_counts) if self.step else {})}
