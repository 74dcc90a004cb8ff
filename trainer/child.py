"""Run one stage's training in a child process of its own (`python -m trainer.child REQUEST.json`).

Why: a trainer leaves things behind in the process that ran it, and a loop of stages must not inherit them.
TRL's colocated vLLM sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and `MASTER_ADDR`/`MASTER_PORT` in `os.environ`
and never removes them (trl/generation/vllm_generation.py), so the next stage's accelerate picks one-process
DDP; its vLLM engine (about a quarter of the GPU) and its parallel groups outlive `del trainer`; torch keeps
its cached blocks. When the child exits, all of it goes with it. Every backend takes this path (CPU too), so
the tests exercise what a GPU runs.

The hand-off is files in the stage folder:
- the parent writes `<out_dir>/logs/stage_request.json` {target, kwargs (JSON), log_level};
- the child calls `target(**kwargs)` (by default `trainer.stage.run_stage`), which writes
  `checkpoint/` (with `trainer_meta.json`: the reward state) and `metrics.json` as it always did;
- the child writes `<out_dir>/logs/stage_status.json` {status: ok | interrupted | error, type, message}
  and logs (INFO lines, tracebacks, a native crash's stack from `faulthandler`) to `<out_dir>/logs/train.log`.

Signals: the child installs the same rule as `graph.run` (first SIGINT/SIGTERM: `trainer.stop.request_stop`,
so the trainers' `StopCallback` ends training after the step under way, saved as an in-stage checkpoint, and
the stage raises `StageInterrupted`; a second one: exit at once). A step that has not ended `STOP_GRACE_S`
seconds after the stop reached the child is ended inside (the child is killed; its last complete in-stage
checkpoint stays). Ctrl-C in a terminal reaches both processes (same process group); a SIGTERM
sent to the parent only is forwarded: the parent watches its own stop flag while it waits and sends the
child SIGUSR1 ("stop at the next step", never counted as a second signal). The child's `StageInterrupted`
becomes the parent's `StageInterrupted`; `CheckpointError`, `ValueError` and `FileNotFoundError` come back
as themselves; any other failure, or a child that dies without a status (killed, segfault, out of memory),
is one `StageProcessError` line naming the stage and its log. The child dies with its parent (Linux
`PR_SET_PDEATHSIG`). Progress bars stay visible: the child inherits the terminal's stdout and stderr.

Several GPUs: `STAGE_LAUNCHER` names a launcher that runs the child once per GPU, e.g.
`STAGE_LAUNCHER="accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 8"`; the
command becomes `<launcher> -m trainer.child REQUEST.json`. Only rank 0 writes the status file (the
trainers write their files on process zero only); the other ranks log to `train.rank<k>.log`. A stop is then
forwarded as SIGTERM, which the launcher passes on to every rank (their first signal: stop at the next step).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = "trainer.stage:run_stage"
REQUEST_FILE = "stage_request.json"
STATUS_FILE = "stage_status.json"
LOG_FILE = "train.log"
POLL_S = 0.2
# after a stop is forwarded, the step under way has this long to finish and be saved; past it, the child is
# ended inside the step (a stop, or a cancelled server run, never waits on a step that runs long under load)
STOP_GRACE_S = 20.0


class StageProcessError(RuntimeError):
    """The stage's child process failed or died; the message names the stage and its log file."""


# exceptions that come back from the child as their own type (the message is kept)
def _known_errors() -> dict[str, type[BaseException]]:
    from llm_backends.checkpoints import CheckpointError
    from trainer.stop import StageInterrupted

    return {
        "StageInterrupted": StageInterrupted,
        "CheckpointError": CheckpointError,
        "ValueError": ValueError,
        "FileNotFoundError": FileNotFoundError,
    }


def stage_logs(out_dir: Path) -> Path:
    return Path(out_dir) / "logs"


def _to_json(value: Any) -> Any:
    """kwargs for the child: pydantic models as {class, data}, paths as absolute text (`_from_json` undoes it)."""
    if hasattr(value, "model_dump"):
        return {"__pydantic__": f"{type(value).__module__}:{type(value).__qualname__}",
                "data": value.model_dump(mode="json")}
    if isinstance(value, os.PathLike):
        return {"__path__": os.fspath(Path(value).absolute())}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if "__pydantic__" in value:
            cls = _import(value["__pydantic__"])
            return cls.model_validate(value["data"])
        if "__path__" in value:
            return Path(value["__path__"])
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _import(target: str):
    import importlib

    module, _, name = target.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def run_in_child(
    out_dir: Path,
    kwargs: dict[str, Any],
    *,
    label: str,
    target: str = DEFAULT_TARGET,
    env: dict[str, str] | None = None,
) -> None:
    """Run `target(**kwargs)` in a fresh Python process and wait for it; raise what it raised (see module doc).

    The target's own return value is not passed back: its results are the files it writes in `out_dir`.
    `label` names the work in error lines ("stage 1 training"). `env`: extra environment variables.
    """
    from trainer import stop

    logs = stage_logs(out_dir)
    logs.mkdir(parents=True, exist_ok=True)
    request, status, log_file = logs / REQUEST_FILE, logs / STATUS_FILE, logs / LOG_FILE
    status.unlink(missing_ok=True)
    request.write_text(json.dumps({
        "target": target,
        "kwargs": _to_json(kwargs),
        "log_level": logging.getLogger().getEffectiveLevel(),
        "label": label,
    }, indent=2) + "\n")
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), child_env.get("PYTHONPATH", "")) if p)
    child_env.update(env or {})
    sys.stderr.flush()
    sys.stdout.flush()
    launcher = shlex.split(child_env.get("STAGE_LAUNCHER", ""))
    cmd = [*launcher, "-m", "trainer.child", str(request)] if launcher else [
        sys.executable, "-m", "trainer.child", str(request)]
    proc = subprocess.Popen(
        cmd,
        env=child_env,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - a prctl only, no locks taken
    )
    forwarded: float | None = None  # when the stop was forwarded
    ended = False
    try:
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            if stop.stop_requested() and forwarded is None:
                # a launcher (torchrun) passes SIGTERM on to its ranks, not SIGUSR1
                _signal(proc, signal.SIGTERM if launcher else signal.SIGUSR1)
                forwarded = time.monotonic()
            elif forwarded is not None and not ended and time.monotonic() - forwarded > STOP_GRACE_S:
                # the step outlasted its grace: end it (a launcher's ranks take a second SIGTERM as "now"); the
                # last complete in-stage checkpoint stays, a half-written one is never resumed from
                _signal(proc, signal.SIGTERM if launcher else signal.SIGKILL)
                ended = True
    except BaseException:
        # the parent is leaving (KeyboardInterrupt, a second signal): the child must not train on alone
        _signal(proc, signal.SIGKILL)
        proc.wait()
        raise
    _raise_from_status(status, code, label, log_file)


def _raise_from_status(status: Path, code: int, label: str, log_file: Path) -> None:
    try:
        doc = json.loads(status.read_text())
    except (OSError, ValueError):
        doc = None
    if doc is not None and doc.get("status") == "ok" and code == 0:
        return
    if doc is not None and doc.get("status") in ("interrupted", "error"):
        kind, message = doc.get("type", "Exception"), doc.get("message", "")
        cls = _known_errors().get(kind)
        if cls is not None:
            raise cls(message)
        first = (message.strip().splitlines() or [""])[0][:400]
        raise StageProcessError(f"{label} failed in its child process: {kind}: {first} (traceback: {log_file})")
    from trainer import stop

    if stop.stop_requested():  # a second signal ended the child at once: still a stop, not a crash
        raise _known_errors()["StageInterrupted"](f"{label} stopped on request before it finished; it trains again on resume "
                                                 "(from its last in-stage checkpoint, if any)")
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    raise StageProcessError(
        f"{label}: its child process {how} before it reported a result (out of memory? see {log_file})"
    )


def run_stage_in_child(
    *,
    train_path: Path,
    init_checkpoint: Path | str,
    out_dir: Path,
    cfg,
    seed: int,
    reward_state: dict | None,
    progress: bool = True,
    task: str,
    warm_start: bool | None = None,
    label: str | None = None,
) -> dict:
    """`trainer.stage.run_stage` in a child process; the same arguments and the same return value
    {"checkpoint", "reward_state", "metrics"}, read back from `checkpoint/trainer_meta.json` and `metrics.json`.

    The cheap checks run here first (vLLM without CUDA, a missing training set, a missing or corrupt
    checkpoint), so that they fail at once with their own error instead of after a child's start-up.
    """
    from llm_backends.checkpoints import META_FILE, check_checkpoint
    from trainer.trl_setup import check_generation_backend

    out_dir = Path(out_dir)
    label = label or f"{out_dir.name} training"
    check_generation_backend(cfg)
    if not Path(train_path).exists():
        raise FileNotFoundError(f"training set {train_path} does not exist (the apply node writes it)")
    check_checkpoint(Path(init_checkpoint))
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = out_dir / "metrics.json"
    metrics_file.unlink(missing_ok=True)  # a stale file from an interrupted attempt must not pass for this one's
    run_in_child(out_dir, dict(train_path=Path(train_path), init_checkpoint=Path(init_checkpoint), out_dir=out_dir,
                               cfg=cfg, seed=seed, reward_state=reward_state, progress=progress,
                               warm_start=warm_start, task=task), label=label)
    ckpt = out_dir / "checkpoint"
    try:
        meta = json.loads((ckpt / META_FILE).read_text())
        metrics = json.loads(metrics_file.read_text())
    except (OSError, ValueError) as e:
        raise StageProcessError(
            f"{label}: its child process reported success but left no readable {ckpt / META_FILE} or "
            f"{metrics_file} ({e}); see {stage_logs(out_dir) / LOG_FILE}"
        ) from None
    return {"checkpoint": str(ckpt), "reward_state": meta["reward_state"], "metrics": metrics}


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux), so no stage trains on without its loop."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the parent kills it on its own way out
        pass


# ---------------------------------------------------------------------------------------------- the child

_SIGNALS = {"count": 0}


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    from trainer import stop

    if signum == signal.SIGUSR1:  # the parent's stop flag, forwarded: never a reason to exit at once
        stop.request_stop(stop.stop_reason() or "stop requested by the run")
        return
    _SIGNALS["count"] += 1
    if _SIGNALS["count"] == 1:
        stop.request_stop(signal.Signals(signum).name)
        return
    os._exit(130)


def _setup_logging(log_file: Path, level: int) -> None:
    root = logging.getLogger()
    root.setLevel(min(level, logging.INFO))
    fmt = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    fh = logging.FileHandler(log_file, encoding="utf-8")
    fh.setLevel(logging.INFO)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    sh = logging.StreamHandler(sys.stderr)  # what the parent would have shown on its terminal
    sh.setLevel(level)
    sh.setFormatter(fmt)
    root.addHandler(sh)


def child_main(request_path: str) -> int:
    import faulthandler
    import traceback

    request = Path(request_path)
    logs = request.parent
    status = logs / STATUS_FILE
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, _on_signal)
    doc = json.loads(request.read_text())
    rank = int(os.environ.get("RANK", "0") or 0)  # set per process by a multi-GPU launcher (STAGE_LAUNCHER)
    log_file = logs / (LOG_FILE if rank == 0 else f"train.rank{rank}.log")
    crash = open(log_file, "a", encoding="utf-8")  # noqa: SIM115 - for faulthandler, open until exit
    crash.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {doc.get('label', '')} (pid {os.getpid()})\n")
    crash.flush()
    faulthandler.enable(file=crash)
    _setup_logging(log_file, int(doc.get("log_level", logging.WARNING)))

    def report(payload: dict) -> None:
        if rank != 0:
            return
        tmp = status.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload) + "\n")
        os.replace(tmp, status)

    try:
        from trainer.stop import StageInterrupted

        target = _import(doc["target"])
        target(**_from_json(doc["kwargs"]))
    except StageInterrupted as e:
        report({"status": "interrupted", "type": "StageInterrupted", "message": str(e)})
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent
        # the traceback goes to the log file only: the terminal gets the parent's one line naming this file
        crash.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {doc.get('label', 'stage')} failed:\n{traceback.format_exc()}")
        crash.flush()
        report({"status": "error", "type": type(e).__name__, "message": str(e)})
        return 1
    report({"status": "ok"})
    return 0


if __name__ == "__main__":
    code = child_main(sys.argv[1])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: vLLM/NCCL atexit hooks can hang in a process that is about to vanish anyway
    os._exit(code)
