"""Stubs of the slow nodes for the fast in-process tests of `python -m graph.run` (no model, no training),
and the small helpers those tests share. The fixtures that install them are ``stub_nodes`` and ``stubs``
in tests/conftest.py."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import graph.graph as gg
from env import SIZES
from graph.settings import build_settings
from trainer.files import stage_dir

ROOT = Path(__file__).resolve().parents[2]


def sizes(data: dict[int, float], hole: float = 0.1, wait: float = 0.25) -> dict:
    return {str(n): {"data_ratio": data.get(n, 0.0), "hole_ratio": hole, "wait_ratio": wait} for n in SIZES}


PROPOSAL = {"sizes": sizes({3: 0.5, 4: 0.5})}


def stub_slow_nodes(monkeypatch) -> None:
    """Stub the slow nodes in graph.graph's namespace (build_graph reads them at call time)."""

    def train_stage(state, runtime):
        k = state["stage"]
        ckpt = stage_dir(runtime.context.run_dir, k) / "checkpoint"
        return {"checkpoint": str(ckpt), "train_metrics": {"train/reward_mean": 0.1},
                "log": [f"stage {k}: trained 0 GRPO steps in 0 s, reward 0.100 -> {ckpt}"]}

    def evaluate(state, runtime):
        return {"metrics": {"eval/valid_rate": 0.5, "eval/optimal_rate": 0.25}}

    def summarize_failures(state, runtime):
        return {"context": "evidence"}

    def propose_config(state, runtime):
        retry = state.get("decision") == "retry"
        return {"proposal": PROPOSAL,
                "rationale": "more small grids", "attempts": int(state.get("attempts") or 0) + 1 if retry else 1,
                "log": ["stage 0: stub engineer proposed"]}

    def final_evaluate(state, runtime):
        return {"final_metrics": {"final/valid_rate": 0.5}}

    def report(state, runtime):
        return {"log": ["report"]}

    for name, fn in dict(train_stage=train_stage, evaluate=evaluate, summarize_failures=summarize_failures,
                         propose_config=propose_config, final_evaluate=final_evaluate, report=report).items():
        monkeypatch.setattr(gg, name, fn)


def settings_for(tmp_path: Path, **over):
    s = build_settings({"engineer": "fixed", **{k: str(v) for k, v in over.items()}}, {"PRESET": "smoke"})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return s.model_copy(update={"run_dir": run_dir}), run_dir


def make_checkpoint(path: Path) -> None:
    """A checkpoint folder with the files a loader needs: config.json and a valid one-tensor safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "stub"}\n')
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


class Stubs:
    """The slow nodes, recording every call: (node, stage, run folder, train_path the node was given)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.crash_train_at: int | None = None  # train_stage of this stage raises (a crash)
        self.on_train = None  # called inside train_stage (e.g. to send a signal)

    def train_stage(self, state, runtime):
        k = state["stage"]
        self.calls.append(("train_stage", k, str(runtime.context.run_dir), state.get("train_path")))
        if self.on_train is not None:
            self.on_train(k)
        if self.crash_train_at == k:
            raise RuntimeError("simulated crash while training")
        ckpt = stage_dir(runtime.context.run_dir, k) / "checkpoint"
        make_checkpoint(ckpt)
        return {"checkpoint": str(ckpt), "train_metrics": {"train/reward_mean": 0.1},
                "log": [f"stage {k}: trained 1 GRPO steps in 0 s, reward 0.100 -> {ckpt}"]}

    def evaluate(self, state, runtime):
        k = state["stage"]
        self.calls.append(("evaluate", k, str(runtime.context.run_dir), state.get("checkpoint")))
        d = stage_dir(runtime.context.run_dir, k)
        (d / "eval.jsonl").write_text(json.dumps({"id": "v0", "size": 3, "valid": True, "optimal": False,
                                                   "failure": None, "text": "x"}) + "\n")
        metrics = {"eval/valid_rate": 0.5, "eval/optimal_rate": 0.25}
        (d / "metrics.json").write_text(json.dumps(metrics))
        return {"metrics": metrics}

    def final_evaluate(self, state, runtime):
        self.calls.append(("final_evaluate", state["stage"], str(runtime.context.run_dir), None))
        return {"final_metrics": {"final/valid_rate": 0.5}}

    def report(self, state, runtime):
        (runtime.context.run_dir / "report.md").write_text("# report\n")
        return {"log": ["report"]}

    def trained(self) -> list[int]:
        return [c[1] for c in self.calls if c[0] == "train_stage"]


# --set flags for a stubbed run: small training sets and feasibility checks
SET = ["--set", "train.instances_per_stage=8", "--set", "feasibility_n=4"]


def run_cli(args: list[str], env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and k not in ("ENGINEER", "PRESET", "STAGES", "RUN_DIR")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "graph.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
