"""A GRPO generation batch as TRL 1.16 hands it to the trainer, built from answer texts (for the credit tests)."""

from __future__ import annotations


def completion_batch(tok, texts: list[str], advantages: list[float]) -> tuple[list[list[int]], dict]:
    """(each text's token ids, a batch of them right-padded, with their masks, one advantage each and the token
    count TRL's loss divides by)."""
    import torch

    ids = [tok(t, add_special_tokens=False).input_ids for t in texts]
    width = max(map(len, ids))
    return ids, {
        "completion_ids": torch.tensor([row + [tok.pad_token_id] * (width - len(row)) for row in ids]),
        "completion_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "num_items_in_batch": torch.tensor(sum(map(len, ids))),
    }
