"""RLVE-Gym's environments as a task family: `TASK=rlve:<environment>` trains and engineers any of the 400
verifiable environments of the `rlve-gym` package (RLVE, arXiv 2511.07317) through the same task seam as
MAPF-FrozenLake and reasoning-gym. Nothing of RLVE is copied: its environments, parameter controllers and scorers
are the package's (`Gym.environments.identifier2environment`, `Gym.parameter_controllers.identifier2controller`).

Name. `rlve:<environment>[:levels=N]`: the environment's identifier (`Multiplication`, `TwoSAT`) or its module's
name (`multiplication`, `two_sat`), and how many levels (default `DEFAULT_LEVELS`, at most `MAX_LEVELS`).

Levels. Level k is step k of the environment's parameter controller (k `update()` calls after its first
parameters, RLVE's difficulty k), labelled with the controller's own parameters at that step (`digit_num=4`; a
step that lists several parameter sets shows each key's values, `N=3 M=3-15`). A problem at level k is generated
by the environment from one of the step's parameter sets (picked by the problem's seed) and that seed.

Generation failures. Each level is tried once at load time (up to `PROBE_SEEDS` seeds, each within the
environment's own generation timeout, `GENERATE_TIMEOUT_S`): a level whose generator raises or times out every
time is dropped with a note (`notes`, shown in the engineer's description of the levels); after a timeout the
harder levels above it are dropped too. An environment left with no level, or named in `REFUSED` (what the full
check, `python -m env.rlve --check`, env/rlve/check.py, found cannot work), is refused in one line.

Answers. The prompt is the environment's own, with one line asking for the final answer between `<answer>` and
`</answer>` (the package's answer markers). The environment's own `verifier` scores it: valid when its accuracy
is 1 (the score reaches the environment's `passing_reward_threshold`); `wrong_format` when it finds no answer in
the expected format; `partial` when the score is above 0 but short of passing; else `wrong`. A verdict's score is
the accuracy (0 or 1), RLVE's training reward (`reward_key = "accuracy"` in its recipe,
tinker_cookbook/recipes/rlve/train.py). The gold answer is the environment's `reference_answer` between the
markers, where the environment keeps one.

Splits. `val` and `test` are fixed, seeded per level from seeds of their own, so every level is in both; a stage's
training problems never repeat one of their prompts (a problem with the same prompt is dropped and redrawn).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import hashlib
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..rg import RgConfig, allocate
from ..task import TaskVerdict

DEFAULT_LEVELS = 8  # controller steps a task has unless its name says otherwise
MAX_LEVELS = 16
SPLIT_SIZES = {"val": 16, "test": 32}  # problems per level; the RLVE rule reads >= 8 of them per level
SPLIT_SEEDS = {"val": 5_000_011, "test": 6_000_007}
GENERATE_TIMEOUT_S = 10  # the environment's own default (Gym.environment.VerifiableEnvironment.generator)
PROBE_SEEDS = 3  # seeds a level is tried with at load time before it is dropped
REDRAWS = 4  # a level's problems are drawn from at most this many times as many seeds as it needs
ANSWER_HINT = "Write your final answer between <answer> and </answer>."
FAILURES = ("wrong_format", "wrong", "partial")
TAG = "__rlve__"  # marks a tagged value in a stored parameter (`encode`)
# Environments that cannot work here, by name, with why (found by `python -m env.rlve --check`, env/rlve/check.py; the list command
# shows them). Their task names are refused in one line.
REFUSED: dict[str, str] = {
    "PolyaModel": "its scorer reads the whole output, not the answer between the markers, so no marked answer "
                  "(its reference answer included) ever passes",
}


class RlveTaskError(ValueError):
    """A task name, environment or level that cannot be used (one line naming what is allowed)."""


@functools.cache
def registry() -> tuple[dict[str, Any], dict[str, Any]]:
    """(identifier -> environment class, identifier -> parameter controller class) of the installed rlve-gym."""
    try:
        from Gym.environments import identifier2environment
        from Gym.parameter_controllers import identifier2controller
    except ImportError as e:
        raise RlveTaskError(f"rlve tasks need the rlve-gym package ({e}); install it: pip install rlve-gym==0.0.1") from e
    return dict(identifier2environment), dict(identifier2controller)


def module_names() -> dict[str, str]:
    """The environments' module names (`multiplication`) -> their identifiers (`Multiplication`)."""
    envs, _ = registry()
    return {cls.__module__.split(".")[2]: ident for ident, cls in envs.items()}


def resolve(environment: str) -> str:
    """The identifier of `environment` (an identifier, a module name, or either in another case)."""
    envs, controllers = registry()
    if environment in envs and environment in controllers:
        return environment
    by_lower = {k.lower(): k for k in envs} | {k.lower(): v for k, v in module_names().items()}
    if environment.lower() in by_lower:
        return by_lower[environment.lower()]
    close = difflib.get_close_matches(environment.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = f"; close: {', '.join(by_lower[c] for c in close)}" if close else ""
    raise RlveTaskError(f"unknown RLVE environment {environment!r}; allowed: one of the {len(envs)} environments of "
                        f"rlve-gym (python -m env.rlve --list){hint}")


def parse_name(name: str) -> tuple[str, int]:
    """`rlve:<environment>[:levels=N]` -> (environment identifier, N)."""
    if not name.startswith("rlve:"):
        raise RlveTaskError(f"task {name!r}: an RLVE task is named rlve:<environment>[:levels=N]")
    environment, _, spec = name[5:].partition(":")
    n = DEFAULT_LEVELS
    if spec:
        m = re.fullmatch(r"levels=(\d+)", spec.strip())
        if not m or not 1 <= int(m.group(1)) <= MAX_LEVELS:
            raise RlveTaskError(f"task {name!r}: {spec!r}: allowed: levels=N with N from 1 to {MAX_LEVELS}")
        n = int(m.group(1))
    try:
        ident = resolve(environment)
    except RlveTaskError as e:
        raise RlveTaskError(f"task {name!r}: {e}") from None
    if ident in REFUSED:
        raise RlveTaskError(f"task {name!r}: RLVE environment {ident} cannot be used: {REFUSED[ident]} "
                            "(python -m env.rlve --list)")
    return ident, n


def _value(values: list) -> str:
    vs = sorted(set(map(json.dumps, values)), key=lambda s: (len(s), s))
    vals = [json.loads(v) for v in vs]
    if len(vals) == 1:
        return _show(vals[0])
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals):
        return f"{_show(min(vals))}-{_show(max(vals))}"
    return "|".join(_show(v) for v in vals)


def _show(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v).replace(" ", "")


@dataclass(frozen=True)
class Level:
    """One step of the controller: its index (RLVE's difficulty) and its parameter sets."""

    index: int
    params: tuple[dict, ...] = field(compare=False)

    @property
    def label(self) -> str:
        keys = list(dict.fromkeys(k for p in self.params for k in p))
        return " ".join(f"{k}={_value([p[k] for p in self.params if k in p])}" for k in keys)


@dataclass(frozen=True)
class RlveItem:
    """One problem: its id, level, generator seed, the environment's parameter after generation (what its scorer
    reads), the prompt and the passing threshold."""

    id: str
    level: int
    seed: int
    parameter: dict = field(compare=False, hash=False)
    prompt: str = field(compare=False)
    threshold: float = 1.0


def encode(v: Any) -> Any:
    """An environment's parameter as JSON that `decode` turns back into the same Python values: tuples, sets and
    dicts with keys that are not strings are tagged (a scorer compares `(a, b) == gold` or looks an int up in a
    dict); numpy values become Python's."""
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v) and TAG not in v:
            return {k: encode(x) for k, x in v.items()}
        return {TAG: "dict", "items": [[encode(k), encode(x)] for k, x in v.items()]}
    if isinstance(v, tuple):
        return {TAG: "tuple", "items": [encode(x) for x in v]}
    if isinstance(v, set | frozenset):
        return {TAG: "set", "items": [encode(x) for x in sorted(v, key=repr)]}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if isinstance(v, str | int | float | bool) or v is None:
        return v
    if hasattr(v, "tolist"):  # numpy arrays and scalars
        return encode(v.tolist())
    raise TypeError(f"{type(v).__name__} value {v!r:.60} cannot be stored")


def decode(v: Any) -> Any:
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    kind = v.get(TAG)
    if kind == "dict":
        return {decode(k): decode(x) for k, x in v["items"]}
    if kind == "tuple":
        return tuple(decode(x) for x in v["items"])
    if kind == "set":
        return {decode(x) for x in v["items"]}
    return {k: decode(x) for k, x in v.items()}


@contextlib.contextmanager
def _kept_rng():
    """The process's random states as they were: an environment's generator seeds `random`, numpy and torch
    globally (Gym.environment.manual_seed) and sets PYTHONHASHSEED, which child processes would inherit."""
    import numpy as np
    import torch

    # not a setting of this project: the variable the package's generator overwrites, put back as it was
    hashseed = "PYTHONHASHSEED"
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state(), os.environ.get(hashseed))
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if state[3] is None:
            os.environ.pop(hashseed, None)
        else:
            os.environ[hashseed] = state[3]


def controller_steps(ident: str, n: int) -> list[tuple[dict, ...]]:
    """The parameter sets of the first `n` steps of the environment's controller."""
    controller = registry()[1][ident]()
    steps = []
    for _ in range(n):
        steps.append(tuple(copy.deepcopy(controller.get_parameter_list())))
        controller.update()
    return steps


class RlveTask:
    """An RLVE-Gym environment as a task family (see the module docstring)."""

    failure_labels = FAILURES
    level_word = "level"
    split_names = tuple(SPLIT_SIZES)

    def __init__(self, name: str):
        self.name = name
        self.environment, n = parse_name(name)
        self._env_class = registry()[0][self.environment]
        self.notes: list[str] = []
        self.levels: list[Level] = []
        self._first: dict[int, RlveItem] = {}
        all_levels = [Level(k, params) for k, params in enumerate(controller_steps(self.environment, n))]
        for lv in all_levels:
            failed, timed_out = self._probe(lv)
            if failed is None:
                self.levels.append(lv)
                continue
            self.notes.append(f"level {lv.index} ({lv.label}) dropped: {failed}")
            if timed_out:
                harder = [str(x.index) for x in all_levels if x.index > lv.index]
                if harder:
                    self.notes.append(f"level{'s' if len(harder) > 1 else ''} {', '.join(harder)} dropped: harder "
                                      f"than level {lv.index}, which timed out")
                break
        if not self.levels:
            raise RlveTaskError(f"task {name!r}: RLVE environment {self.environment} generates no problem at any of "
                                f"its first {n} levels ({'; '.join(self.notes)})")
        self._index = {lv.index: lv for lv in self.levels}

    def _probe(self, level: Level) -> tuple[str | None, bool]:
        """(why the level is dropped, or None; whether it timed out)."""
        why, timed_out = "", False
        for j in range(PROBE_SEEDS):
            start = time.monotonic()
            item = self.problem(level, _mix(1_000_003, level.index, j))
            if item is not None:
                self._first[level.index] = item
                return None, False
            timed_out = time.monotonic() - start >= 0.9 * GENERATE_TIMEOUT_S
            why = "the generator timed out" if timed_out else "the generator raised"
            if timed_out:
                break
        return f"{why} (seeds tried: {j + 1}, {GENERATE_TIMEOUT_S} s each at most)", timed_out

    # ------------------------------------------------------------------ generation

    def environment_of(self, item: RlveItem | None = None):
        """A fresh environment object; set to `item`'s problem when given (what its scorer reads)."""
        env = self._env_class()
        if item is not None:
            env.set_config({"seed": item.seed, "parameter": copy.deepcopy(item.parameter),
                            "passing_reward_threshold": item.threshold})
        return env

    def problem(self, level: Level | int, seed: int) -> RlveItem | None:
        """The problem the environment generates at `level` from `seed`, or None when its generator raises or
        times out."""
        lv = level if isinstance(level, Level) else self._level(level)
        parameter = copy.deepcopy(lv.params[random.Random(seed).randrange(len(lv.params))])
        env = self._env_class()
        with _kept_rng():
            try:
                if not env.generator(seed=seed, parameter=parameter, timeout_second=GENERATE_TIMEOUT_S):
                    return None
                prompt = str(env.prompt_generator())
                kept = decode(json.loads(json.dumps(encode(env.parameter))))
            except Exception:  # an environment's own bug at this seed: the caller draws another
                return None
        digest = hashlib.sha256(f"{self.environment}|{lv.index}|{prompt}".encode()).hexdigest()[:12]
        return RlveItem(f"{self.environment}-L{lv.index}-{digest}", lv.index, seed, kept, prompt,
                        float(getattr(env, "passing_reward_threshold", 1.0)))

    def _level(self, index: int) -> Level:
        if index not in self._index:
            raise RlveTaskError(f"task {self.name!r}: level {index!r}: allowed: "
                                f"{', '.join(str(lv.index) for lv in self.levels)}")
        return self._index[index]

    def level_items(self, level: int, n: int, seed: int, avoid: set[str] | None = None) -> list[RlveItem]:
        """`n` problems of `level` from seeds derived from `seed`, none of whose prompt is in `avoid` (fewer when
        the environment cannot make that many distinct ones within `REDRAWS` times `n` seeds)."""
        self._level(level)
        out: list[RlveItem] = []
        seen = set(avoid or ())
        for j in range(max(n, 1) * REDRAWS):
            if len(out) >= n:
                break
            item = self.problem(level, _mix(seed, level, j))
            if item is None or item.prompt in seen:
                continue
            seen.add(item.prompt)
            out.append(item)
        return out

    def generate(self, config: RgConfig, n: int, seed: int) -> tuple[list[RlveItem], dict[str, Any]]:
        """A stage's `n` problems, spread over the config's levels by their shares (largest remainders), in a
        shuffled order; none repeats a prompt of the fixed splits."""
        counts = allocate(config.levels, n)
        avoid = self.split_prompts()
        items: list[RlveItem] = []
        for level, k in counts.items():
            if k:
                items.extend(self.level_items(level, k, seed=_mix(seed, level), avoid=avoid))
        random.Random(seed).shuffle(items)
        return items, {"requested": {str(k): v for k, v in counts.items()},
                       "generated": {str(lv): sum(1 for i in items if i.level == lv) for lv in counts}}

    def split(self, name: str) -> list[RlveItem]:
        """The fixed split `name` (val or test): `SPLIT_SIZES[name]` problems per level."""
        if name not in SPLIT_SIZES:
            raise RlveTaskError(f"split {name!r}: allowed for rlve tasks: {', '.join(SPLIT_SIZES)}")
        return list(self._splits[name])

    @cached_property
    def _splits(self) -> dict[str, list[RlveItem]]:
        out: dict[str, list[RlveItem]] = {}
        taken: set[str] = set()
        for name, per in SPLIT_SIZES.items():
            items: list[RlveItem] = []
            for lv in self.levels:
                got = self.level_items(lv.index, per, seed=_mix(SPLIT_SEEDS[name], lv.index), avoid=taken)
                taken.update(i.prompt for i in got)
                items.extend(got)
            out[name] = items
        return out

    def split_prompts(self) -> set[str]:
        return {i.prompt for items in self._splits.values() for i in items}

    # ------------------------------------------------------------------ the trainer's seam (trainer.task.Task)

    def item_to_json(self, item: RlveItem) -> str:
        return json.dumps({"id": item.id, "level": item.level, "seed": item.seed, "parameter": encode(item.parameter),
                           "prompt": item.prompt, "threshold": item.threshold})

    def item_from_json(self, text: str) -> RlveItem:
        d = json.loads(text)
        return RlveItem(d["id"], int(d["level"]), int(d["seed"]), decode(d["parameter"]), d["prompt"],
                        float(d.get("threshold", 1.0)))

    def item_id(self, item: RlveItem) -> str:
        return item.id

    def level(self, item: RlveItem) -> int:
        return item.level

    def prompt(self, item: RlveItem, style: str = "compact") -> list[dict]:
        return [{"role": "user", "content": f"{item.prompt}\n\n{ANSWER_HINT}"}]

    def reference(self, item: RlveItem) -> str | None:
        """The environment's reference answer as text, or None where it keeps none."""
        ref = item.parameter.get("reference_answer")
        if ref is None:
            return None
        if isinstance(ref, list | tuple):
            return " ".join(map(str, ref))
        return str(ref)

    def gold(self, item: RlveItem) -> str:
        """The reference answer between the answer markers; "" where the environment keeps none."""
        ref = self.reference(item)
        return "" if ref is None else f"<answer>{ref}</answer>"

    def warm_start_items(self, levels: list[int] | None, n: int, seed: int) -> list[RlveItem]:
        """`n` fresh problems spread evenly over every level, none in a fixed split, each with a reference answer
        that the environment scores valid. An environment without one has no warm start (one line)."""
        share = {lv.index: 1 / len(self.levels) for lv in self.levels}
        items, _ = self.generate(RgConfig(levels=share, num_instances=n), n, seed=_mix(seed, 104_729))
        kept = [i for i in items if self.reference(i) is not None and self.verify(i, self.gold(i)).valid]
        if not kept:
            raise RlveTaskError(f"task {self.name!r}: RLVE environment {self.environment} keeps no reference answer "
                                "that its scorer accepts, so it has no SFT warm start; allowed: "
                                "train.sft_warm_start=false")
        return kept

    def verify(self, item: RlveItem, text: str) -> TaskVerdict:
        env = self.environment_of(item)
        try:
            result = env.verifier(str(text))
        except Exception:  # a score out of the environment's own bounds: no credit
            return TaskVerdict(False, "wrong", 0.0, False)
        if result["accuracy"]:
            return TaskVerdict(True, None, 1.0, True)
        if not result["format_score"]:
            return TaskVerdict(False, "wrong_format", 0.0, False)
        return TaskVerdict(False, "partial" if result["reward"] > 0 else "wrong", 0.0, False)

    # ------------------------------------------------------------------ what the loop shows the engineer

    def describe_attributes(self) -> str:
        return (f"- RLVE-Gym environment `{self.environment}`; each level is one step of its parameter controller "
                "(level k: k steps up from its first parameters), shown as the controller's parameters")

    def describe_levels(self) -> str:
        lines = ["| level | controller parameters |", "|---|---|"]
        lines += [f"| {lv.index} | {lv.label} |" for lv in self.levels]
        return "\n".join(lines + [f"\nNote: {n}" for n in self.notes])

    def parse_config(self, raw: Any, num_instances: int | None = None) -> RgConfig:
        """A config from the engineer's JSON (`{"levels": {...}}`), strictly: an unknown level, a share outside
        [0, 1] or shares not summing to 1 raise `ValueError` naming the value and what is allowed."""
        if isinstance(raw, RgConfig):
            return raw
        allowed = ", ".join(str(lv.index) for lv in self.levels)
        if not isinstance(raw, dict):
            raise ValueError(f"config {raw!r}: allowed: an object {{\"levels\": {{\"<level>\": share, ...}}}}")
        extra = set(raw) - {"levels", "num_instances"}
        if extra:
            raise ValueError(f"config: unknown key(s) {', '.join(sorted(map(str, extra)))}; allowed: levels")
        levels = raw.get("levels")
        if not isinstance(levels, dict):
            raise ValueError(f"levels {levels!r}: allowed: an object mapping a level ({allowed}) to its share")
        shares: dict[int, Any] = {}
        for k, v in levels.items():
            lv = int(k) if re.fullmatch(r"\s*-?\d+\s*", str(k)) else None
            if lv not in self._index:
                raise ValueError(f"levels: {k!r} is not a level; allowed: {allowed}")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"levels[{k}] = {v!r}: allowed: a number in [0, 1]")
            shares[lv] = v
        n = num_instances if num_instances is not None else raw.get("num_instances", 64)
        return RgConfig(levels=shares, num_instances=n)

    def project(self, raw: Any) -> RgConfig:
        """The nearest valid config: known levels only, negative shares dropped, the rest scaled to sum to 1."""
        levels = raw.get("levels") if isinstance(raw, dict) else None
        if not isinstance(levels, dict):
            raise ValueError("no levels to project")
        kept = {int(k): float(v) for k, v in levels.items()
                if re.fullmatch(r"\s*-?\d+\s*", str(k)) and int(k) in self._index and isinstance(v, int | float)
                and not isinstance(v, bool) and math.isfinite(v) and v > 0}
        total = sum(kept.values())
        if not kept or total <= 0:
            raise ValueError("no level with a positive share")
        return RgConfig(levels={k: v / total for k, v in kept.items()})  # the caller sets num_instances

    def random_config(self, seed: int, num_instances: int = 64) -> RgConfig:
        """A random stage-0 config: 1-3 levels from the easier half, random shares."""
        rng = random.Random(seed)
        half = [lv.index for lv in self.levels[: max(1, (len(self.levels) + 1) // 2)]]
        picked = rng.sample(half, k=min(len(half), rng.randint(1, 3)))
        w = [rng.random() + 0.1 for _ in picked]
        return RgConfig(levels={lv: x / sum(w) for lv, x in zip(picked, w, strict=True)},
                        num_instances=num_instances)


def _mix(seed: int, *parts: int) -> int:
    """A seed below 2**32 (numpy's limit) from `seed` and `parts`."""
    return int(hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).hexdigest()[:8], 16)
