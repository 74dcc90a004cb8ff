"""A toy task family for the task seam's tests: add two numbers. Not MAPF, and nothing of env/ is used.

Levels are the digits of each term (1-3). An item is a dict; its gold answer is the sum; a verdict's failure
label is `no_answer` (no number in the answer) or `wrong`.
"""

from __future__ import annotations

import json
import random
import re

from trainer.task import Verdict


class ToyTask:
    name = "toy-add"
    failure_labels = ("no_answer", "wrong")

    def item_to_json(self, item: dict) -> str:
        return json.dumps(item, sort_keys=True)

    def item_from_json(self, text: str) -> dict:
        return json.loads(text)

    def item_id(self, item: dict) -> str:
        return item["id"]

    def level(self, item: dict) -> int:
        return int(item["digits"])

    def prompt(self, item: dict, style: str) -> list[dict]:
        return [{"role": "user", "content": f"What is {item['a']} + {item['b']}? Answer with the number only."}]

    def gold(self, item: dict) -> str:
        return str(item["a"] + item["b"])

    def generate(self, levels: list[int], n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        out = []
        for i in range(n):
            d = levels[i % len(levels)]
            a, b = rng.randrange(10 ** (d - 1), 10**d), rng.randrange(10 ** (d - 1), 10**d)
            out.append({"id": f"add-{seed}-{i}", "a": a, "b": b, "digits": d})
        return out

    def warm_start_items(self, levels: list[int], n: int, seed: int) -> list[dict]:
        return self.generate(levels, n, seed + 1_000_003)

    def verify(self, item: dict, answer: str) -> Verdict:
        found = re.findall(r"-?\d+", answer or "")
        if not found:
            return Verdict(valid=False, label="no_answer", score=0.0)
        ok = int(found[-1]) == item["a"] + item["b"]
        return Verdict(valid=ok, label=None if ok else "wrong", score=float(ok), optimal=ok)
