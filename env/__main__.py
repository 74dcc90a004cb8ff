"""Command line for the MAPF-FrozenLake testbed.

    python -m env generate --config CONFIG.json|random --n N --seed S [--agents K] --out FILE.jsonl
    python -m env verify --instances FILE.jsonl --answers ANSWERS.jsonl --out VERDICTS.jsonl
    python -m env benchmark --list | --split NAME --out FILE.jsonl | --build
    python -m env export (--split NAME | --instances FILE.jsonl | --config C --n N --seed S) --out ROWS.jsonl
    python -m env show (--instances FILE.jsonl [--id ID] | --split NAME [--id ID]) [--png FILE.png] [--steps]

Bad input gets one clear line on stderr and exit status 2; output files are written to a temp file and
renamed into place (``generate --stats``: both files only once both are written), so a failed command
leaves no partial output behind. Any other error is also reported as one ``error:`` line, exit status 2.
An error line echoes input: it is cut to ``MAX_ECHO`` characters and freed of control characters. Ctrl-C
prints one line and exits with status 130, leaving no output behind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

from .benchmark import BenchmarkIntegrityError, build, list_splits, load_split, split_info
from .config import MAX_AGENTS, EnvConfig, format_validation_error, random_config
from .generator import generate
from .instance import Instance, atomic_write_lines, dumps, format_instance_error, read_jsonl
from .prompt import PROMPT_STYLES, render_prompt
from .reward import accuracy_reward
from .show import draw, save_png
from .verify import FAILURES, verify

MAX_N = 1_000_000  # the most instances one generate call makes: EnvConfig's num_instances bound
MAX_ECHO = 500  # characters of an error line (an error may quote a huge field of the input)
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _one_line(msg: str) -> str:
    """`msg` as printed: control characters removed, cut to MAX_ECHO characters with the cut said."""
    msg = _CONTROL.sub("", msg.replace("\n", " "))
    if len(msg) > MAX_ECHO:
        msg = msg[:MAX_ECHO] + f"... ({len(msg) - MAX_ECHO} more characters)"
    return msg


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
    except UnicodeDecodeError as e:
        raise CLIError(f"{what} {path} is not valid UTF-8 text: {_bad_byte(e)}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CLIError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None


def _bad_byte(e: UnicodeDecodeError) -> str:
    return f"byte 0x{e.object[e.start]:02x} at offset {e.start}"


def _config(arg: str, seed: int, agents: int | None = None) -> EnvConfig:
    if arg == "random":
        # Hole ratios are drawn under the caps of the agent count actually generated (3..5 agents
        # allow fewer holes). 1 agent keeps the 2-agent draw: those caps are stricter, so it is valid,
        # and `--agents 1` output stays what it always was.
        return random_config(seed, num_agents=max(agents or 2, 2))
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
    if not 0 <= a.n <= MAX_N:
        raise CLIError(f"--n must be between 0 and {MAX_N} (the most a config's num_instances allows; every "
                       f"instance is held in memory), got {a.n}; make a larger set in parts with different --seed")
    if a.agents is not None and not 1 <= a.agents <= MAX_AGENTS:
        raise CLIError(f"--agents must be between 1 and {MAX_AGENTS}, got {a.agents}")
    outputs = [a.out] + ([a.stats] if a.stats else [])
    if a.stats and Path(a.stats).resolve() == Path(a.out).resolve():
        raise CLIError(f"--stats {a.stats} is the same file as --out; give the statistics their own file")
    for path in outputs:
        if Path(path).is_dir():
            raise CLIError(f"cannot write {path}: it is a directory; give a file path")
    cfg = _config(a.config, a.seed, a.agents)
    if a.agents is not None:
        try:
            cfg = EnvConfig.model_validate({**cfg.model_dump(), "num_agents": a.agents})
        except ValueError as e:
            raise CLIError(f"--agents {a.agents}: {format_validation_error(e)}") from None
    # Claim a temp file next to every output before the expensive step: an unwritable path fails now.
    staged = _Staged(outputs)
    try:
        gen = generate(cfg, a.n, a.seed, workers=a.workers)
        staged.write(a.out, (i.to_json() for i in gen.instances))
        if a.stats:
            staged.write(a.stats, [json.dumps(gen.stats, indent=1)])
        staged.commit()
    finally:
        staged.discard()
    sf = gen.stats["shortfalls"]
    print(f"wrote {len(gen.instances)} instances to {a.out} "
          f"(shortfalls: {sf['dropped']} dropped, {sf['wait']} wait, {sf['nowait']} no-wait)")
    return 0


class _Staged:
    """Several output files written to temp files first and renamed into place together.

    `commit` renames them all; if one rename fails, the outputs it already put in place are removed, so
    either every file is written or none is. `discard` removes whatever temp files are left.
    """

    def __init__(self, paths: list[str]) -> None:
        self.tmp: dict[str, str] = {}
        try:
            for p in paths:
                target = Path(p)
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                except OSError as e:
                    raise CLIError(f"cannot write {p}: {e.strerror or e}") from None
                os.close(fd)
                self.tmp[p] = tmp
        except BaseException:
            self.discard()
            raise

    def write(self, path: str, lines) -> None:
        with open(self.tmp[path], "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line)
                f.write("\n")

    def commit(self) -> None:
        umask = os.umask(0)
        os.umask(umask)
        done: list[str] = []
        try:
            for p, tmp in self.tmp.items():
                os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
                os.replace(tmp, p)
                done.append(p)
        except OSError as e:
            for written in done:
                Path(written).unlink(missing_ok=True)
            raise CLIError(f"cannot write {p}: {e.strerror or e}; no output was left behind") from None
        self.tmp = {}

    def discard(self) -> None:
        for tmp in self.tmp.values():
            Path(tmp).unlink(missing_ok=True)
        self.tmp = {}


def _read_instances(path: str) -> list[Instance]:
    """Instances of an instance file, or of a file of `export` rows (each row's `instance`)."""
    try:
        return read_jsonl(path, unique_ids=True)
    except OSError as e:
        raise CLIError(f"cannot read instances {path}: {e.strerror or e}") from None
    except ValueError as e:
        rows = _export_rows(path)
        if rows is None:
            raise CLIError(str(e).splitlines()[0]) from None
        return rows


def _export_rows(path: str) -> list[Instance] | None:
    """The instances of a file written by `export` (rows with `prompt` and `instance`), or None if it is not one."""
    try:
        lines = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
        first = json.loads(lines[0]) if lines else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not (isinstance(first, dict) and "prompt" in first and isinstance(first.get("instance"), str)):
        return None
    out: list[Instance] = []
    seen: set[str] = set()
    for no, line in enumerate(lines, 1):
        try:
            inst = Instance.from_json(json.loads(line)["instance"])
        except (ValueError, KeyError, TypeError) as e:
            raise CLIError(f"{path}: row {no}: not an export row with a valid \"instance\": "
                           f"{format_instance_error(e)}") from None
        if inst.id in seen:
            raise CLIError(f"{path}: row {no}: duplicate instance id {inst.id!r}; ids must be unique within a file")
        seen.add(inst.id)
        out.append(inst)
    return out


def _read_answers(path: str) -> list[dict]:
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except OSError as e:
        raise CLIError(f"cannot read answers {path}: {e.strerror or e}") from None
    out = []
    first_line: dict = {}
    for no, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CLIError(f"{path}:{no}: not valid UTF-8 text ({_bad_byte(e)} of the line); "
                           "answers are UTF-8 JSON lines") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise CLIError(f"{path}:{no}: not valid JSON: {e.msg}") from None
        if not isinstance(obj, dict) or "id" not in obj:
            raise CLIError(f"{path}:{no}: missing \"id\" (each line is {{\"id\": ..., \"text\": ...}})")
        if isinstance(obj["id"], list | dict):  # no instance has one: ids are strings
            raise CLIError(f"{path}:{no}: \"id\" is a JSON {'array' if isinstance(obj['id'], list) else 'object'} "
                           f"({json.dumps(obj['id'])[:60]}); an answer's id is the string id of its instance")
        if not isinstance(obj.get("text"), str):
            raise CLIError(f"{path}:{no}: \"text\" must be a string")
        key = json.dumps(obj["id"])  # ids may be any JSON value; 1 and "1" are different ids
        if key in first_line:
            raise CLIError(f"{path}:{no}: duplicate answer id {obj['id']!r} (first on line {first_line[key]}); "
                           "give each instance at most one answer")
        first_line[key] = no
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
    total_acc = 0.0
    for ans in answers:
        inst = instances[ans["id"]]
        v = verify(inst, ans["text"], a.criterion)
        valid += v.valid
        optimal += v.optimal
        acc = accuracy_reward(v)
        total_acc += acc
        per_size[inst.size][v.failure or "valid"] += 1
        rows.append(dumps({"id": inst.id, "valid": v.valid, "optimal": v.optimal, "failure": v.failure,
                           "cost": v.cost, "optimal_cost": v.optimal_cost, "makespan": v.makespan,
                           "optimal_makespan": v.optimal_makespan, "criterion": v.criterion, "reward": acc,
                           "details": v.details}))
    atomic_write_lines(a.out, rows)
    n = len(answers)
    print(f"{n} answers: valid {valid / n if n else 0:.3f}, optimal ({a.criterion}) {optimal / n if n else 0:.3f}, "
          f"mean reward {total_acc / n if n else 0:.3f} (R_acc, the accuracy part; no length term)")
    cols = ["valid", *FAILURES]
    print("size " + " ".join(f"{c:>16}" for c in cols))
    for s in sorted(per_size):
        print(f"{s:>4} " + " ".join(f"{per_size[s][c]:>16}" for c in cols))
    answered = {json.dumps(ans["id"]) for ans in answers}
    missing = [i for i in instances if json.dumps(i) not in answered]
    m = len(instances)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        print(f"unanswered: {len(missing)} of {m} instances have no answer and are not in the rates above "
              f"(over all {m}, unanswered counted as invalid: valid {valid / m:.3f}, optimal {optimal / m:.3f}); "
              f"ids: {shown}")
    else:
        print(f"unanswered: 0 of {m} instances (every instance has an answer)")
    return 0


def cmd_export(a) -> int:
    from .library import row

    sources = [x for x in (a.split, a.instances, a.config) if x]
    if len(sources) != 1:
        raise CLIError("export needs exactly one of --split NAME, --instances FILE.jsonl, or --config CONFIG.json|random "
                       "(with --n and --seed)")
    if a.style not in PROMPT_STYLES:
        raise CLIError(f"--style {a.style!r}: allowed: {', '.join(PROMPT_STYLES)}")
    if Path(a.out).is_dir():
        raise CLIError(f"cannot write {a.out}: it is a directory; give a file path")
    if a.split:
        try:
            insts = load_split(a.split)
        except (BenchmarkIntegrityError, ValueError) as e:
            raise CLIError(str(e)) from None
    elif a.instances:
        insts = _read_instances(a.instances)
    else:
        if a.n is None or a.seed is None:
            raise CLIError("export --config needs --n N and --seed S")
        if not 0 <= a.n <= MAX_N:
            raise CLIError(f"--n must be between 0 and {MAX_N}, got {a.n}")
        insts = generate(_config(a.config, a.seed), a.n, a.seed).instances
    atomic_write_lines(a.out, (dumps(row(i, a.style)) for i in insts))
    print(f"wrote {len(insts)} rows (prompt, answer, instance, instance_id, metadata) to {a.out}")
    return 0


def _span(xs: list[int]) -> str:
    """[3, 4, 5] -> '3..5'; [2] -> '2'; gaps are listed: [3, 5] -> '3,5'."""
    if len(xs) > 1 and xs == list(range(xs[0], xs[-1] + 1)):
        return f"{xs[0]}..{xs[-1]}"
    return ",".join(map(str, xs))


def cmd_benchmark(a) -> int:
    if a.list:
        for name, desc in list_splits().items():
            info = split_info(name)
            if info["error"]:
                print(f"{name:10} {info['error']:58} {desc}")
                continue
            sizes, agents = _span(info["sizes"]), _span(info["agents"])
            print(f"{name:10} {info['count']:>5} instances  sizes {sizes:6} agents {agents:5} "
                  f"sha256 {info['sha256'][:12]}  {desc}")
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
        save_png(inst, a.png, steps=a.steps)
        print(f"wrote {a.png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m env", description="MAPF-FrozenLake testbed")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate instances from a config")
    g.add_argument("--config", required=True, help="CONFIG.json or 'random' (random_config(seed))")
    g.add_argument("--n", type=int, required=True, help="number of instances")
    g.add_argument("--seed", type=int, required=True, help="seed: same (config, n, seed) gives the same bytes")
    g.add_argument("--agents", type=int, default=None,
                   help=f"agents per instance, 1..{MAX_AGENTS} (default 2; one agent never needs a wait, so its "
                        "wait slots are reported as shortfalls)")
    g.add_argument("--out", required=True, help="output .jsonl, one instance per line")
    g.add_argument("--stats", default=None,
                   help="also write the generator statistics here (JSON); both files are written or neither")
    g.add_argument("--workers", type=int, default=None, help="worker processes (default: CPU count); output does not depend on it")
    v = sub.add_parser("verify", help="verify answers against instances",
                       description="Verify answers against instances. Each verdict's `reward` is R_acc, the "
                                   "accuracy part of the reward (0 if invalid, 1 if optimal, 1.0 -> 0.3 with the "
                                   "cost gap), not the length-weighted total used in training.")
    v.add_argument("--instances", required=True, help="instances .jsonl (from generate or benchmark)")
    v.add_argument("--answers", required=True, help='answers .jsonl: {"id": ..., "text": ...} per line')
    v.add_argument("--criterion", choices=("soc", "makespan"), default="soc",
                   help="what optimal means: soc (sum of costs, the default) or makespan (the paper's \"makespan-optimal\")")
    v.add_argument("--out", required=True,
                   help="verdicts .jsonl; `reward` there is R_acc (accuracy part only, no length term); "
                        "a summary goes to stdout")
    b = sub.add_parser("benchmark", help="list, export or (deliberately) rebuild the benchmark splits")
    b.add_argument("--list", action="store_true",
                   help="list the splits: instance count, map sizes, agents, sha256 prefix (checked on load)")
    b.add_argument("--split", help="split name (see --list), e.g. val, val-mini, test, test-mini")
    b.add_argument("--out", help="write the split's instances to this .jsonl")
    b.add_argument("--build", action="store_true", help="regenerate env/data (changes committed files)")
    b.add_argument("--workers", type=int, default=None, help="worker processes for --build")
    x = sub.add_parser("export", help="write dataset rows with the prompt and the optimal answer",
                       description="Write one dataset row a line: prompt (chat messages), answer (the optimal plan in "
                                   "the answer format), instance (JSON), instance_id, metadata. Load it with "
                                   "datasets.load_dataset('json', data_files=FILE) or env.library.")
    x.add_argument("--split", help="a benchmark split name (see benchmark --list)")
    x.add_argument("--instances", help="or an instances .jsonl")
    x.add_argument("--config", help="or CONFIG.json|random, generated with --n and --seed")
    x.add_argument("--n", type=int, default=None, help="instances to generate (with --config)")
    x.add_argument("--seed", type=int, default=None, help="generator seed (with --config)")
    x.add_argument("--style", default="full", help=f"prompt style: {' | '.join(PROMPT_STYLES)} (default full)")
    x.add_argument("--out", required=True, help="output .jsonl, one row per instance")
    s = sub.add_parser("show", help="draw an instance and its optimal plan")
    s.add_argument("--instances", help="instances .jsonl to take the instance from")
    s.add_argument("--split", help="or a benchmark split name")
    s.add_argument("--id", help="instance id (default: the first instance)")
    s.add_argument("--png", help="also draw it to this PNG file")
    s.add_argument("--steps", action="store_true",
                   help="print every step of the plan as text; with --png, draw one panel per step")
    s.add_argument("--prompt", action="store_true", help="print the policy prompt instead")
    try:
        a = p.parse_args(argv)
        return {"generate": cmd_generate, "verify": cmd_verify, "benchmark": cmd_benchmark, "show": cmd_show,
                "export": cmd_export}[
            a.cmd
        ](a)
    except CLIError as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; no output was written", file=sys.stderr)
        return 130
    except Exception as e:  # last resort: still one line, no traceback (the commands write atomically)
        first = (str(e).splitlines() or [""])[0]
        print(f"error: {_one_line(f'{type(e).__name__}: {first}')}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
