"""Every RLVE-Gym environment checked, and the list of them: `python -m env.rlve --list | --check [names]`.

`--check` loads each environment of the installed rlve-gym as a task (`env/rlve/__init__.py`, `rlve:<environment>:levels=N`,
default 2 levels), and at each level it kept: generates a problem, stores it as a stage file would (its JSON
line, read back), and scores with the environment's own verifier the reference answer (where the environment keeps
one: it must be valid), an answer without the answer markers (it must be `wrong_format`) and a junk answer between
them (it must not be valid). It prints one line per environment (`ok`, with the levels it dropped and why, or what
failed and why) and a count; `--json PATH` writes the results. An environment that does not work here belongs in `env/rlve/__init__.py` `REFUSED`, with
why: its task name is then refused in one line, and `--list` shows it.

`--list` prints every environment: its identifier, its module name (either names it in `rlve:<environment>`), and
`refused: why` for those in `REFUSED`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from . import REFUSED, RlveTask, module_names, registry

JUNK = "<answer>no idea, sorry</answer>"
UNMARKED = "the answer is 42"


def check_environment(ident: str, levels: int = 2) -> dict[str, Any]:
    """One environment checked at its first `levels` levels: {"environment", "ok", "problems": [...], "notes",
    "levels", "reference": levels whose reference answer verified, "no_reference": levels without one, "seconds"}."""
    start = time.monotonic()
    out: dict[str, Any] = {"environment": ident, "problems": [], "notes": [], "levels": [], "reference": [],
                           "no_reference": []}
    try:
        task = RlveTask(f"rlve:{ident}:levels={levels}")
    except ValueError as e:
        out["problems"].append(str(e).splitlines()[0])
    else:
        out["notes"] = list(task.notes)
        for lv in task.levels:
            out["levels"].append(lv.index)
            item = task.item_from_json(task.item_to_json(task._first[lv.index]))
            if task.prompt(item)[0]["content"].strip() == "":
                out["problems"].append(f"level {lv.index}: empty prompt")
            ref = task.reference(item)
            if ref is None:
                out["no_reference"].append(lv.index)
            else:
                v = task.verify(item, task.gold(item))
                if v.valid:
                    out["reference"].append(lv.index)
                else:
                    out["problems"].append(f"level {lv.index}: the reference answer {ref[:60]!r} scores {v.label}")
            junk = task.verify(item, JUNK)
            if junk.valid:
                out["problems"].append(f"level {lv.index}: a junk answer scores valid")
            bare = task.verify(item, UNMARKED)
            if bare.label != "wrong_format":
                out["problems"].append(f"level {lv.index}: an answer without markers scores {bare.label or 'valid'}, "
                                       "not wrong_format")
    out["ok"] = not out["problems"]
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


def check_all(names: list[str] | None = None, levels: int = 2, echo=None) -> list[dict[str, Any]]:
    """`check_environment` over `names` (default every environment of the installed rlve-gym, refused ones too)."""
    results = []
    for ident in names or sorted(registry()[0]):
        r = check_environment(ident, levels)
        results.append(r)
        if echo:
            echo(_line(r))
    return results


def _line(r: dict[str, Any]) -> str:
    if r["ok"]:
        extra = f" (no reference answer at levels {r['no_reference']})" if r["no_reference"] else ""
        extra += "".join(f"; {n}" for n in r["notes"])
        return f"ok       {r['environment']} [{r['seconds']:.2f} s]{extra}"
    return f"FAILS    {r['environment']} [{r['seconds']:.2f} s]: {'; '.join(r['problems'])}"


def list_lines() -> list[str]:
    modules = {v: k for k, v in module_names().items()}
    out = []
    for ident in sorted(registry()[0]):
        state = f"refused: {REFUSED[ident]}" if ident in REFUSED else "ok"
        out.append(f"{ident:<48} {modules.get(ident, ''):<48} {state}")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m env.rlve", description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="every environment, and why a refused one is refused")
    p.add_argument("--check", nargs="*", metavar="ENVIRONMENT",
                   help="check these environments (default: every one) at their first --levels levels")
    p.add_argument("--levels", type=int, default=2, help="levels checked per environment (default 2)")
    p.add_argument("--json", metavar="PATH", help="write the check's results to PATH")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(list_lines()))
        print(f"{len(registry()[0])} environments, {len(REFUSED)} refused")
        return
    if args.check is None:
        p.error("give --list or --check")
    results = check_all(args.check or None, args.levels, echo=lambda s: print(s, flush=True))
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)} of {len(results)} environments ok; failing: "
          f"{', '.join(r['environment'] for r in bad) or 'none'}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    sys.exit(1 if [r for r in bad if r["environment"] not in REFUSED] else 0)
