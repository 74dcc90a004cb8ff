"""The engineer's prompt of each family, pinned in tests/golden/prompts/ (tests/test_golden_prompts.py).

For each family a fixed situation after stage 1 of 3 (a history with stage 0, a rationale, the stage's training
signal per level, failing answers on real questions of the evaluation split) is rendered exactly as
propose_config sends it: the system prompt, then the user message (the context of the run's variant). The test
never writes the files; re-recording is a deliberate command, whose `git diff tests/golden/prompts/` is then
reviewed like code:

    python -m tests.support.golden_prompts --record
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "prompts"
FAMILIES = ("mapf", "toy", "rg")


def _settings(name: str):
    from tests.support.node_helpers import make_settings

    if name == "mapf":
        return make_settings(context="V6")
    task = "tests.support.toy_task:ToyTask" if name == "toy" else "rg:basic_arithmetic"
    train = {"optimizer": "filtered"} if name == "rg" else {}
    return make_settings(task=task, context="V6", eval_split="val", final_split="test", train=train)


def _dump(config: Any) -> dict:
    return config.model_dump(mode="json") if hasattr(config, "model_dump") else config


def situation(name: str) -> tuple[Any, Any, dict, list[dict]]:
    """(family, settings, state after stage 1's evaluation, its eval rows) for the family `name`."""
    from families import family_of

    settings = _settings(name)
    fam = family_of(settings)
    split = fam.split(settings.eval_split)
    items = split[:: max(1, len(split) // 24)][:24]  # every level of the split
    levels = [k for k in sorted({str(fam.task.level(i)) for i in items}, key=int)]
    answers = ["", "-10", "I think it is\n42", "Agent 0: (0,0) (0,1)"]
    rows = [fam.verdict_row(it, fam.task.gold(it) if i % 3 == 0 else answers[i % len(answers)], None, "stop",
                            "makespan") for i, it in enumerate(items)]
    first = fam.first_config(None, 1, 12)
    second = fam.first_config(None, 2, 12)
    train = {}
    for j, lv in enumerate(levels):
        train[f"train/level/{lv}/reward_mean"] = round(0.1 * j, 3)
        train[f"train/level/{lv}/valid_rate"] = round(0.05 * j, 3)
        train[f"train/level/{lv}/completions"] = 32
        if name == "rg":
            train[f"train/level/{lv}/kept"] = 2 * j
        else:
            train[f"train/level/{lv}/zero_std_groups"] = round(1 - 0.1 * j, 3)
    state = {
        "stage": 1,
        "config": _dump(second),
        "metrics": fam.metrics(rows),
        "history": [{"stage": 0, "config": _dump(first), "metrics": fam.metrics(rows[: len(rows) // 2]),
                     "decision": None}],
        "rationale": "Shift data toward the levels where some answers pass.",
        "decision": "accepted",
        "train_metrics": train,
    }
    return fam, settings, state, rows


def render(name: str) -> str:
    """The family's system prompt and user message, as propose_config sends them."""
    from nodes.propose_config import user_message

    fam, settings, state, rows = situation(name)
    context = fam.context(state, settings, rows, None)
    return f"# system\n\n{fam.system_prompt(settings)}\n\n# user\n\n{user_message(context, [])}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.golden_prompts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="write tests/golden/prompts/<family>.md anew")
    args = ap.parse_args(argv)
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    changed = 0
    for name in FAMILIES:
        text, path = render(name), GOLDEN_DIR / f"{name}.md"
        old = path.read_text() if path.is_file() else ""
        if old != text:
            changed += 1
            print("".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), "new")))
            if args.record:
                path.write_text(text)
    print(f"{changed} of {len(FAMILIES)} prompts differ" + (" (recorded)" if args.record and changed else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
