"""Running the grid: every pair that is not finished, one `python -m graph.run` subprocess at a time (or
`jobs` at once, each pinned to its own share of the cores), resumable after a crash or Ctrl-C, with its log,
its wall time and the machine it ran on recorded, and its verdict files collected as soon as it finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.config import REPO_ROOT, EvalConfigError, repo_relative
from evals.pairs import (
    Pair,
    check_api_engineer,
    check_settings,
    child_env,
    donor_candidates,
    find_donor,
    settings_drift,
    short_command,
    stage0_donor,
)
from evals.results import read_json
from trainer.files import stage_dir, stage_numbers, weights_sha256

EXIT_BAD_SETTINGS = 2  # graph.run's status for a refused setting (and argparse's for an unknown flag)
EXIT_INTERRUPTED = 130  # graph.run's status when a signal stopped it (graph.interrupt): the grid stops too


class EventLog:
    """Progress lines for people (stderr, through tqdm when a bar is shown) and `<out>/events.log`."""

    def __init__(self, path: Path | None, write: Callable[[str], None] | None = None):
        self.path = path
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, line: str) -> None:
        self._write(line)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


@dataclass
class GridResult:
    ran: list[str] = field(default_factory=list)  # pairs for which a graph.run subprocess was started
    skipped: dict[str, str] = field(default_factory=dict)  # pair or arm -> reason (visible, never silent)
    failed: dict[str, str] = field(default_factory=dict)
    finished: list[Pair] = field(default_factory=list)


def run_grid(
    pairs: Sequence[Pair],
    *,
    preset: str,
    overrides: Mapping[str, Any],
    out: Path,
    dry_run: bool = False,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    share_stage0: bool = False,
    jobs: int = 1,
) -> GridResult:
    """Check everything, then run every pair that is not finished (resume partial ones), `jobs` at a time.

    With `jobs` > 1 the usable cores are split into `jobs` equal slots; each graph.run is pinned to one slot
    (its stage children and vLLM server inherit the pinning) with as many OMP threads as the slot has cores.
    On 2 cores two single-threaded runs do more work per hour than one run on both: a 135M model's decode steps
    are too small to keep two threads busy (`jobs_cores`). With `share_stage0`, a pair waits while a run of its
    seed that would be its donor is still in stage 0, and starts as a fork once that stage 0 has finished.

    Arms whose API engineer cannot run (no key) are skipped with a line; a pair whose settings are bad
    is reported and left out, before anything expensive starts. With `share_stage0`, a new pair starts
    from the stage 0 of a donor run of its seed (`find_donor`, checked just before it starts) and runs in
    full when there is none. Per-pair wall times, the machine and the stage-0 donor go to
    `<out>/timings.json`; each child's output to `<out>/logs/<pair>.log`.
    """
    from tqdm import tqdm

    if not isinstance(jobs, int) or jobs < 1:
        raise EvalConfigError(f"--jobs {jobs!r}: allowed: a whole number from 1 to the number of cores")
    slots = jobs_cores(jobs)  # checked before anything runs
    env = dict(os.environ if env is None else env)
    log = EventLog(None if dry_run else out / "events.log", write=lambda s: tqdm.write(s, file=sys.stderr))
    result = GridResult()
    todo: list[tuple[Pair, bool]] = []
    arm_reason: dict[str, str | None] = {}
    for pair in pairs:
        if pair.arm.label not in arm_reason:
            arm_reason[pair.arm.label] = check_api_engineer(pair.arm, env)
            if arm_reason[pair.arm.label]:
                log(f"[skip] engineer {pair.arm.label}: {arm_reason[pair.arm.label]} -- all its seeds are left out")
                result.skipped[pair.arm.label] = arm_reason[pair.arm.label]
        if arm_reason[pair.arm.label]:
            continue
        status = pair.status()
        kept = out / "verdicts" / pair.name
        if status == "new" and (kept / "final" / "eval.jsonl").is_file():
            # finished on another day or machine: its run folder is gone, its committed verdicts remain
            drift = settings_drift(pair, preset, overrides, env, saved_path=kept / "settings.json")
            note = f" (WARNING: made with other settings: {'; '.join(drift)[:300]})" if drift else ""
            log(f"[skip] {pair.name}: finished earlier, verdicts kept in {kept}, not redone{note}")
            result.finished.append(pair)
            continue
        if status == "finished":
            drift = settings_drift(pair, preset, overrides, env)
            note = f" (WARNING: made with other settings: {'; '.join(drift)[:300]})" if drift else ""
            log(f"[skip] {pair.name}: finished in {pair.run_dir}, not redone{note}")
            result.finished.append(pair)
            continue
        if status == "blocked":
            msg = f"{pair.run_dir} exists, is not empty and holds no settings.json; move it away or change runs_dir"
            log(f"[error] {pair.name}: {msg}")
            result.failed[pair.name] = msg
            continue
        if status == "partial":
            drift = settings_drift(pair, preset, overrides, env)
            if drift:
                log(f"[warn] {pair.name}: resuming with the run's saved settings, which differ: {'; '.join(drift)[:300]}")
        else:
            err = check_settings(pair, preset, overrides, env)
            if err:
                log(f"[error] {pair.name}: {err}")
                result.failed[pair.name] = err
                continue
        todo.append((pair, status == "partial"))

    runs_dirs = sorted({p.run_dir.parent for p in pairs})

    def donor_of(pair: Pair) -> Path | None:
        return find_donor(pair, donor_candidates(pair, pairs, runs_dirs), preset, overrides, env)

    planned_donor: dict[int, Pair] = {}  # seed -> the first pair planned to run in full (dry-run display)
    for pair, resume in todo:
        donor = donor_of(pair) if share_stage0 and not resume else None
        cmd = short_command(pair.command(preset, overrides, resume=resume, stage0_from=donor, donor=share_stage0))
        if resume:
            how = "resume"
        elif not share_stage0:
            how = "run"
        elif donor is not None:
            how = f"run, stage 0 from {repo_relative(donor)}"
        elif pair.seed in planned_donor:
            first = planned_donor[pair.seed]
            how = f"run, stage 0 from {first.name} once it has finished stage 0 (adds --stage0-from {repo_relative(first.run_dir)})"
        else:
            how = f"run in full (stage-0 donor of seed {pair.seed})"
        if share_stage0 and donor is None and pair.seed not in planned_donor:
            planned_donor[pair.seed] = pair
        log(f"[plan] {pair.name}: {how}: {cmd}")
    if slots is not None:
        log(f"[plan] {jobs} runs at once, pinned to cores " + " | ".join(",".join(map(str, c)) for c in slots)
            + f", {len(slots[0])} OMP thread(s) each" + ("; a fork waits for its donor's stage 0" if share_stage0 else ""))
    if dry_run:
        log(f"[dry-run] {len(todo)} run(s) planned, {len(result.finished)} finished, "
            f"{len(result.skipped)} arm(s) skipped, {len(result.failed)} bad; nothing was started")
        return result

    timings_path = out / "timings.json"
    timings = read_json(timings_path) or {}
    here = machine()
    lock = threading.Lock()  # timings.json, result and the log, shared by the job threads

    def run_one(pair: Pair, resume: bool, cores: list[int] | None) -> None:
        donor = donor_of(pair) if share_stage0 and not resume else None
        # with stage 0 shared, a run that trains its own stage 0 may be a donor: it keeps every checkpoint
        cmd = pair.command(preset, overrides, resume=resume, stage0_from=donor, donor=share_stage0)
        log_path = out / "logs" / f"{pair.name}.log"
        where = f" (cores {','.join(map(str, cores))})" if cores is not None else ""
        log(f"[start] {pair.name}{where}: {short_command(cmd)}")
        with lock:
            result.ran.append(pair.name)
        penv = child_env(pair.arm, env)
        if cores is not None:
            penv = {**penv, "OMP_NUM_THREADS": str(len(cores)), "MKL_NUM_THREADS": str(len(cores))}
        pinned = {} if cores is None else {"cores": cores}
        rc, wall = _run_child(cmd, log_path, pair.name, timeout_s, penv, **pinned)
        if donor is not None and rc == EXIT_BAD_SETTINGS and pair.status() == "new":
            # graph.run refused the donor (or does not know --stage0-from yet): stage 0 in full instead
            log(f"[warn] {pair.name}: graph.run refused --stage0-from {repo_relative(donor)} (exit {rc}: "
                f"{_last_line(log_path)}); running its stage 0 in full")
            donor = None
            cmd = pair.command(preset, overrides, resume=False, donor=True)
            log(f"[start] {pair.name}{where}: {short_command(cmd)}")
            rc, wall2 = _run_child(cmd, log_path, pair.name, timeout_s, penv, **pinned)
            wall += wall2
        with lock:
            t = timings.setdefault(pair.name, {"wall_s": 0.0, "calls": 0})
            t["wall_s"] = round(t["wall_s"] + wall, 1)
            t["calls"] += 1
            t["last_rc"] = rc
            t["machine"] = here  # where this pair ran (the last call's machine when it ran on several)
            if here not in t.setdefault("machines", []):
                t["machines"].append(here)
            t["jobs"] = jobs  # runs at once: their wall times are not comparable with a run that had every core
            t["stage0_from"] = stage0_donor(pair.run_dir) or (repo_relative(donor) if donor is not None else None)
            t["stage0_shared"] = t["stage0_from"] is not None
            timings_path.write_text(json.dumps(timings, indent=2) + "\n")
            if rc == 0 and pair.status() == "finished":
                log(f"[done] {pair.name}: {wall:.0f}s")
                result.finished.append(pair)
                collect_verdicts(pair, out)  # at once, so an interrupted grid keeps every finished pair's rows
            else:
                msg = f"graph.run exited with {rc} after {wall:.0f}s; see {repo_relative(log_path)}"
                log(f"[fail] {pair.name}: {msg}; rerun the same command to resume it")
                result.failed[pair.name] = msg
                if rc == EXIT_INTERRUPTED:  # somebody stopped this run: not a failure to step over
                    interrupted.set()

    interrupted = threading.Event()  # a graph.run stopped by a signal (exit 130): start nothing more
    _STOPPING.clear()  # a grid stopped earlier in this process does not stop this one

    def check_interrupted() -> None:
        if interrupted.is_set():
            log("[stop] a graph.run was interrupted (exit 130): the grid stops; rerun the same command to resume")
            raise KeyboardInterrupt

    bar = tqdm(total=len(todo), desc="runs", unit="run", file=sys.stderr, disable=not todo)
    if slots is None:
        try:
            with sigterm_interrupts():
                for pair, resume in todo:
                    bar.set_postfix_str(pair.name)
                    run_one(pair, resume, None)
                    bar.update()
                    check_interrupted()
        finally:
            bar.close()
        return result

    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    def may_start(pair: Pair, resume: bool, running: list[Pair]) -> bool:
        """Not while a run of its seed that would be its stage-0 donor is still training stage 0."""
        if not share_stage0 or resume or not any(r.seed == pair.seed for r in running):
            return True
        return donor_of(pair) is not None

    pending, running, free = list(todo), {}, list(slots)
    pool = ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="grid-job")
    try:
        with sigterm_interrupts():
            while pending or running:
                for item in list(pending):
                    if free and may_start(*item, [p for p, _ in running.values()]):
                        pending.remove(item)
                        cores = free.pop(0)
                        running[pool.submit(run_one, *item, cores)] = (item[0], cores)
                bar.set_postfix_str(", ".join(p.name for p, _ in running.values()))
                done, _ = wait(running, timeout=15, return_when=FIRST_COMPLETED)  # a donor's stage 0 may end
                for f in done:
                    _, cores = running.pop(f)
                    free.append(cores)
                    bar.update()
                    f.result()  # a bug in run_one stops the grid, as in the sequential loop
                check_interrupted()
    except KeyboardInterrupt:
        _stop_children()  # graph.run handles SIGTERM like Ctrl-C: every run stays resumable
        raise
    finally:
        pool.shutdown(wait=True)
        bar.close()
    return result


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside, SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does: `kill <grid>` then stops
    every graph.run in flight (each stays resumable) instead of leaving them running without their grid. A grid
    started in the background (`... &`, nohup) ignores SIGINT, so SIGTERM is how it is stopped. Nothing is changed
    off the main thread, where Python cannot set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def jobs_cores(jobs: int) -> list[list[int]] | None:
    """The cores of each of `jobs` slots (equal, contiguous shares of the cores this process may use), or None
    for one job (the run uses every core, as before). More jobs than cores is one clear error."""
    from llm_backends.vllm_server import usable_cores

    if jobs == 1:
        return None
    cores = usable_cores()
    if not 1 <= jobs <= len(cores):
        raise EvalConfigError(f"--jobs {jobs}: this process may use {len(cores)} core(s); allowed: 1 to {len(cores)}")
    k = len(cores) // jobs
    return [cores[i * k:(i + 1) * k] for i in range(jobs)]


_CHILDREN: set[subprocess.Popen] = set()  # graph.run calls in flight (several with jobs > 1)
_CHILDREN_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set by _stop_children: a job thread starts no graph.run after it


def _stop_children() -> None:
    with _CHILDREN_LOCK:
        _STOPPING.set()
        procs = list(_CHILDREN)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def _run_child(cmd: list[str], log_path: Path, name: str, timeout_s: float | None,
               env: Mapping[str, str], cores: list[int] | None = None) -> tuple[int, float]:
    """Run one graph.run (pinned to `cores` if given), appending its output to `log_path` and echoing its
    `[...]` progress lines."""
    from tqdm import tqdm

    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
    with open(log_path, "a") as logf:
        logf.write(f"\n$ {short_command(cmd)}\n")
        logf.flush()
        with _CHILDREN_LOCK:  # started and registered at once, so _stop_children sees it or it never starts
            if _STOPPING.is_set():
                logf.write("not started: the grid is stopping\n")
                return EXIT_INTERRUPTED, 0.0
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env={**env, "PYTHONUNBUFFERED": "1"},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    preexec_fn=pin)
            _CHILDREN.add(proc)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                logf.flush()
                if line.startswith("[") or line.startswith("error:") or line.startswith("interrupted"):
                    tqdm.write(f"  {name} {line.rstrip()}", file=sys.stderr)
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    proc.terminate()
                    tqdm.write(f"  {name} timed out after {timeout_s:.0f}s; stopping it", file=sys.stderr)
                    break
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()  # graph.run handles SIGTERM like Ctrl-C: the run stays resumable
            proc.wait()
            raise
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    return rc, time.monotonic() - t0


def machine() -> str:
    """One line describing this machine (CPU model, cores, memory, NVIDIA GPUs), for the results' timings;
    `run_grid` records it per pair in timings.json when the pair runs."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpus = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            gpus += [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("Model:")]
        except OSError:
            pass
    gpu = f", GPU {' + '.join(gpus)}" if gpus else ""
    return f"{cpu}, {os.cpu_count()} cores{mem}{gpu}, {platform.system()}, Python {platform.python_version()}"


def collect_verdicts(pair: Pair, out: Path) -> Path:
    """Copy a finished pair's verdict files to `<out>/verdicts/<pair>/` (small; no checkpoints); return it.
    Besides the answers' verdicts and each stage's config, each stage's `validation.json` and
    `engineer_reply.md` are kept: what the engineer proposed, in its own words, and what validation did with it."""
    dest = out / "verdicts" / pair.name
    files = ["settings.json", "final/eval.jsonl", "final/eval_sampled.jsonl", "final/metrics.json",
             "final_cpu/eval.jsonl", "stage0_from.json"]
    for k in stage_numbers(pair.run_dir):
        files += [str(stage_dir(Path(), k) / name) for name in ("eval.jsonl", "eval_sampled.jsonl", "config.json",
                                                                "validation.json", "engineer_reply.md")]
    for rel in files:
        src = pair.run_dir / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            if not (dest / rel).is_file() or (dest / rel).read_bytes() != src.read_bytes():
                shutil.copyfile(src, dest / rel)
    record_weights(pair.run_dir, dest)
    return dest


WEIGHTS_FILE = "weights.json"


def record_weights(run_dir: Path, dest: Path) -> dict[str, dict[str, str]]:
    """Write `<dest>/weights.json`: the sha256 of every weight file (`*.safetensors`) of each stage's checkpoint,
    as `sha256sum` prints it, so that a reader can tell from the committed evidence which runs ended with the same
    weights (training is deterministic on one machine; then any gap between their rows is the evaluation's own
    noise). Stages already recorded are not hashed again; a run folder without checkpoints writes nothing."""
    path = dest / WEIGHTS_FILE
    known: dict[str, dict[str, str]] = read_json(path) or {}
    out = dict(known)
    for k in stage_numbers(run_dir):
        key = f"stage_{k}"
        if key in out:
            continue
        if digests := weights_sha256(stage_dir(run_dir, k) / "checkpoint"):
            out[key] = digests
    if out != known:
        dest.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(sorted(out.items(), key=lambda kv: int(kv[0].split("_")[1]))), indent=2) + "\n")
    return out
