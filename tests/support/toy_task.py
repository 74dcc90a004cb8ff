"""A toy task family for the task seam's tests: add two numbers. Not MAPF, and nothing of env/ is used.

Levels are the digits of each term (1-3). An item is a dict; its gold answer is the sum; a verdict's failure
label is `no_answer` (no number in the answer) or `wrong`. Beside the trainer's methods it has the loop's
(`families/level_share.py`): a config of level shares, generation from it, fixed splits and a description of its
levels, so the whole loop runs on it.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, field_validator

from trainer.task import Verdict


@dataclass(frozen=True)
class Level:
    index: int
    label: str


class ToyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    levels: dict[int, float]
    num_instances: int = 8

    @field_validator("levels")
    @classmethod
    def _shares(cls, v: dict[int, float]) -> dict[int, float]:
        bad = [k for k in v if k not in (1, 2, 3)]
        if bad:
            raise ValueError(f"levels: {bad[0]} is not a level; allowed: 1, 2, 3")
        if any(not 0 <= s <= 1 for s in v.values()) or abs(sum(v.values()) - 1) > 1e-6:
            raise ValueError(f"levels: shares {list(v.values())}; allowed: shares in [0, 1] that sum to 1")
        return v


class ToyTask:
    name = "toy-add"
    failure_labels = ("no_answer", "wrong")
    level_word = "digits"
    levels = [Level(d, f"{d}-digit terms") for d in (1, 2, 3)]
    split_names = ("val", "test")

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

    def make(self, levels: list[int], n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        out = []
        for i in range(n):
            d = levels[i % len(levels)]
            a, b = rng.randrange(10 ** (d - 1), 10**d), rng.randrange(10 ** (d - 1), 10**d)
            out.append({"id": f"add-{seed}-{i}", "a": a, "b": b, "digits": d})
        return out

    def warm_start_items(self, levels: list[int], n: int, seed: int) -> list[dict]:
        return self.make(levels, n, seed + 1_000_003)

    def verify(self, item: dict, answer: str) -> Verdict:
        found = re.findall(r"-?\d+", answer or "")
        if not found:
            return Verdict(valid=False, label="no_answer", score=0.0)
        ok = int(found[-1]) == item["a"] + item["b"]
        return Verdict(valid=ok, label=None if ok else "wrong", score=float(ok), optimal=ok)

    # ----- the loop's share (families/level_share.py)

    def parse_config(self, raw, num_instances: int | None = None) -> ToyConfig:
        if not isinstance(raw, dict) or not isinstance(raw.get("levels"), dict):
            raise ValueError(f"config {raw!r}: allowed: {{\"levels\": {{\"<digits>\": share}}}}")
        levels = {}
        for k, v in raw["levels"].items():
            if not str(k).isdigit():
                raise ValueError(f"levels: {k!r} is not a level; allowed: 1, 2, 3")
            levels[int(k)] = v
        return ToyConfig(levels=levels, num_instances=num_instances or raw.get("num_instances", 8))

    def project(self, raw) -> ToyConfig:
        kept = {int(k): float(v) for k, v in (raw.get("levels") or {}).items()
                if str(k) in ("1", "2", "3") and isinstance(v, int | float) and math.isfinite(v) and v > 0}
        if not kept:
            raise ValueError("no level with a positive share")
        return ToyConfig(levels={k: v / sum(kept.values()) for k, v in kept.items()})

    def random_config(self, seed: int, num_instances: int = 8) -> ToyConfig:
        d = random.Random(seed).choice([1, 2, 3])
        return ToyConfig(levels={d: 1.0}, num_instances=num_instances)

    def generate(self, config: ToyConfig, n: int, seed: int) -> tuple[list[dict], dict]:
        levels = [lv for lv, share in sorted(config.levels.items()) for _ in range(round(share * n))][:n]
        levels += [max(config.levels, key=config.levels.get)] * (n - len(levels))
        items = [dict(i, digits=d) for i, d in zip(self.make([1], n, seed), levels, strict=True)]
        rng = random.Random(seed)
        for it in items:
            d = it["digits"]
            it["a"], it["b"] = rng.randrange(10 ** (d - 1), 10**d), rng.randrange(10 ** (d - 1), 10**d)
        return items, {"by_level": {str(d): levels.count(d) for d in sorted(set(levels))}}

    def split(self, name: str) -> list[dict]:
        if name not in self.split_names:
            raise ValueError(f"split {name!r}: allowed: val, test")
        return self.make([1, 2, 3], 6, seed={"val": 11, "test": 12}[name])

    def describe_levels(self) -> str:
        return "\n".join(f"- level {lv.index}: {lv.label}" for lv in self.levels)
