"""Command line for the MAPF-FrozenLake testbed.

    python -m env generate --config CONFIG.json|random --n N --seed S [--agents K] --out FILE.jsonl
    python -m env verify --instances FILE.jsonl --answers ANSWERS.jsonl --out VERDICTS.jsonl
    python -m env benchmark --list | --split NAME --out FILE.jsonl | --build
    python -m env show (--instances FILE.jsonl [--id ID] | --split NAME [--id ID]) [--png FILE.png]

Bad input gets one clear line on stderr and exit status 2; output files are written to a temp file and
renamed into place, so a failed command leaves no partial output behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from .benchmark import BenchmarkIntegrityError, build, list_splits, load_split
from .config import MAX_AGENTS, EnvConfig, format_validation_error, random_config
from .generator import generate
from .instance import Instance, atomic_write_lines, dumps, read_jsonl
from .prompt import render_prompt
from .reward import accuracy_reward
from .verify import FAILURES, verify


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage dump
        raise CLIError(f"{self.prog}: {message}")


def _load_json(path: str, what: str):
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise CLIError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CLIError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def _config(arg: str, seed: int) -> EnvConfig:
    if arg == "random":
        return random_config(seed)
    raw = _load_json(arg, "config")
    if isinstance(raw, dict) and "sizes" in raw and isinstance(raw["sizes"], dict):
        # JSON keys are strings; the model's keys are ints.
        try:
            raw = {**raw, "sizes": {int(k): v for k, v in raw["sizes"].items()}}
        except ValueError:
            bad = next(k for k in raw["sizes"] if not str(k).lstrip("-").isdigit())
            raise CLIError(f"config {arg}: sizes: key {bad!r} is not a map size (3..10)") from None
    try:
        return EnvConfig.model_validate(raw)
    except ValueError as e:
        raise CLIError(f"config {arg}: {format_validation_error(e)}") from None


def cmd_generate(a) -> int:
    if a.n < 0:
        raise CLIError(f"--n must be >= 0, got {a.n}")
    if a.agents is not None and not 1 <= a.agents <= MAX_AGENTS:
        raise CLIError(f"--agents must be between 1 and {MAX_AGENTS}, got {a.agents}")
    cfg = _config(a.config, a.seed)
    if a.agents is not None:
        try:
            cfg = EnvConfig.model_validate({**cfg.model_dump(), "num_agents": a.agents})
        except ValueError as e:
            raise CLIError(f"--agents {a.agents}: {format_validation_error(e)}") from None
    gen = generate(cfg, a.n, a.seed, workers=a.workers)
    atomic_write_lines(a.out, (i.to_json() for i in gen.instances))
    if a.stats:
        atomic_write_lines(a.stats, [json.dumps(gen.stats, indent=1)])
    sf = gen.stats["shortfalls"]
    print(f"wrote {len(gen.instances)} instances to {a.out} "
          f"(shortfalls: {sf['dropped']} dropped, {sf['wait']} wait, {sf['nowait']} no-wait)")
    return 0


def _read_instances(path: str) -> list[Instance]:
    try:
        return read_jsonl(path)
    except OSError as e:
        raise CLIError(f"cannot read instances {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise CLIError(str(e).splitlines()[0]) from None


def _read_answers(path: str) -> list[dict]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise CLIError(f"cannot read answers {path}: {e.strerror or e}") from None
    out = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CLIError(f"{path}:{no}: not valid JSON: {e.msg}") from None
        if not isinstance(obj, dict) or "id" not in obj:
            raise CLIError(f"{path}:{no}: missing \"id\" (each line is {{\"id\": ..., \"text\": ...}})")
        if not isinstance(obj.get("text"), str):
            raise CLIError(f"{path}:{no}: \"text\" must be a string")
        out.append(obj)
    return out


def cmd_verify(a) -> int:
    instances = {i.id: i for i in _read_instances(a.instances)}
    answers = _read_answers(a.answers)
    for ans in answers:
        if ans["id"] not in instances:
            raise CLIError(f"answer id {ans['id']!r} is not in {a.instances}")
    rows = []
    per_size: dict[int, Counter] = defaultdict(Counter)
    valid = optimal = 0
    for ans in answers:
        inst = instances[ans["id"]]
        v = verify(inst, ans["text"])
        valid += v.valid
        optimal += v.optimal
        per_size[inst.size][v.failure or "valid"] += 1
        rows.append(dumps({"id": inst.id, "valid": v.valid, "optimal": v.optimal, "failure": v.failure,
                           "cost": v.cost, "optimal_cost": v.optimal_cost, "reward": accuracy_reward(v),
                           "details": v.details}))
    atomic_write_lines(a.out, rows)
    n = len(answers)
    print(f"{n} answers: valid {valid / n if n else 0:.3f}, optimal {optimal / n if n else 0:.3f}")
    cols = ["valid", *FAILURES]
    print("size " + " ".join(f"{c:>16}" for c in cols))
    for s in sorted(per_size):
        print(f"{s:>4} " + " ".join(f"{per_size[s][c]:>16}" for c in cols))
    return 0


def cmd_benchmark(a) -> int:
    if a.list:
        for name, desc in list_splits().items():
            print(f"{name:10} {desc}")
        return 0
    if a.build:
        report = build(workers=a.workers)
        print(json.dumps(report["counts"]), f"in {report['total_seconds']}s")
        return 0
    if not a.split or not a.out:
        raise CLIError("benchmark needs --list, --build, or --split NAME --out FILE.jsonl")
    try:
        insts = load_split(a.split)
    except (BenchmarkIntegrityError, ValueError) as e:
        raise CLIError(str(e)) from None
    atomic_write_lines(a.out, (i.to_json() for i in insts))
    print(f"wrote {len(insts)} instances of split {a.split} to {a.out}")
    return 0


def draw(inst: Instance, t: int | None = None) -> str:
    """The map as text with the legend symbols; with `t`, agents' plan positions at step t as digits."""
    from .prompt import GOAL_SYMBOLS, START_SYMBOLS

    cells = [list(row) for row in inst.grid]
    for i, (r, c) in enumerate(inst.goals):
        cells[r][c] = GOAL_SYMBOLS[i]
    for i, (r, c) in enumerate(inst.starts):
        cells[r][c] = START_SYMBOLS[i]
    if t is not None:
        for i, p in enumerate(inst.plan):
            r, c = p[min(t, len(p) - 1)]
            cells[r][c] = str(i)
    return "\n".join(" ".join(row) for row in cells)


def _png(inst: Instance, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = inst.size
    fig, ax = plt.subplots(figsize=(1 + 0.6 * n, 1 + 0.6 * n))
    for r, row in enumerate(inst.grid):
        for c, ch in enumerate(row):
            ax.add_patch(plt.Rectangle((c, n - 1 - r), 1, 1, color="#1f3b5a" if ch == "H" else "#dff1fb"))
    colors = ["tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown"]
    for i, p in enumerate(inst.plan):
        xs = [c + 0.5 + 0.06 * (i - 2) for _, c in p]
        ys = [n - 1 - r + 0.5 + 0.06 * (i - 2) for r, _ in p]
        ax.plot(xs, ys, "-o", color=colors[i], ms=3, label=f"agent {i}")
        ax.text(xs[0], ys[0], "S", color=colors[i], ha="center", va="center", weight="bold")
        ax.text(xs[-1], ys[-1], "G", color=colors[i], ha="center", va="center", weight="bold")
    ax.set_xlim(0, n)
    ax.set_ylim(0, n)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{inst.id}: cost {inst.optimal_cost}, makespan {inst.makespan}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, bbox_inches="tight", dpi=100)
    plt.close(fig)
    tmp.replace(path)


def cmd_show(a) -> int:
    if a.instances:
        insts = _read_instances(a.instances)
    elif a.split:
        try:
            insts = load_split(a.split)
        except (BenchmarkIntegrityError, ValueError) as e:
            raise CLIError(str(e)) from None
    else:
        raise CLIError("show needs --instances FILE.jsonl or --split NAME")
    if not insts:
        raise CLIError("no instances to show")
    if a.id is None:
        inst = insts[0]
    else:
        inst = next((i for i in insts if i.id == a.id), None)
        if inst is None:
            raise CLIError(f"no instance with id {a.id!r}")
    if a.prompt:
        print(render_prompt(inst))
        return 0
    print(f"{inst.id}: {inst.size}x{inst.size}, {inst.num_agents} agents, optimal sum of costs "
          f"{inst.optimal_cost}, makespan {inst.makespan}, needs_wait {inst.needs_wait}")
    print(draw(inst))
    for i, p in enumerate(inst.plan):
        print(f"Agent {i}: " + " ".join(f"({r},{c})" for r, c in p))
    if a.steps:
        for t in range(inst.makespan + 1):
            print(f"\nstep {t}\n{draw(inst, t)}")
    if a.png:
        _png(inst, a.png)
        print(f"wrote {a.png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m env", description="MAPF-FrozenLake testbed")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate instances from a config")
    g.add_argument("--config", required=True, help="CONFIG.json or 'random' (random_config(seed))")
    g.add_argument("--n", type=int, required=True, help="number of instances")
    g.add_argument("--seed", type=int, required=True, help="seed: same (config, n, seed) gives the same bytes")
    g.add_argument("--agents", type=int, default=None, help="agents per instance, 2..5 (default 2)")
    g.add_argument("--out", required=True, help="output .jsonl, one instance per line")
    g.add_argument("--stats", default=None, help="also write the generator statistics here (JSON)")
    g.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count); output does not depend on it")
    v = sub.add_parser("verify", help="verify answers against instances")
    v.add_argument("--instances", required=True, help="instances .jsonl (from generate or benchmark)")
    v.add_argument("--answers", required=True, help='answers .jsonl: {"id": ..., "text": ...} per line')
    v.add_argument("--out", required=True, help="verdicts .jsonl (a summary goes to stdout)")
    b = sub.add_parser("benchmark", help="list, export or (deliberately) rebuild the benchmark splits")
    b.add_argument("--list", action="store_true", help="list the splits with their sizes and checksums")
    b.add_argument("--split", help="split name (see --list), e.g. val, val-mini, test, test-mini")
    b.add_argument("--out", help="write the split's instances to this .jsonl")
    b.add_argument("--build", action="store_true", help="regenerate env/data (changes committed files)")
    b.add_argument("--workers", type=int, default=None, help="worker processes for --build")
    s = sub.add_parser("show", help="draw an instance and its optimal plan")
    s.add_argument("--instances", help="instances .jsonl to take the instance from")
    s.add_argument("--split", help="or a benchmark split name")
    s.add_argument("--id", help="instance id (default: the first instance)")
    s.add_argument("--png", help="also draw it to this PNG file")
    s.add_argument("--steps", action="store_true", help="draw every step of the plan")
    s.add_argument("--prompt", action="store_true", help="print the policy prompt instead")
    try:
        a = p.parse_args(argv)
        return {"generate": cmd_generate, "verify": cmd_verify, "benchmark": cmd_benchmark, "show": cmd_show}[
            a.cmd
        ](a)
    except CLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
