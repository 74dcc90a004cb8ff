"""evals/solve_direct.py against the scripted OpenAI-compatible server (tests/support/fakeopenai.py): a server that
answers every benchmark prompt with the solver's optimal plan scores 100% valid and optimal; an unset key
is a visible skip; a rerun asks only what is missing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from evals import config, grid, solve_direct
from tests.support.fakeopenai import FakeOpenAI

LIMIT = 18


@pytest.fixture
def optimal_server():
    """A fake endpoint that replies to each benchmark prompt with that instance's optimal plan."""
    from env import load_split, plan_text, render_prompt

    plans = {render_prompt(inst): plan_text(inst.plan) for inst in load_split("test-mini")}

    def reply(body: dict) -> str:
        return plans[body["messages"][-1]["content"]]

    with FakeOpenAI(default=reply) as srv:
        yield srv


def write_config(tmp: Path, base_url: str) -> Path:
    cfg = tmp / "solve.yaml"
    cfg.write_text(
        f"# python -m evals.solve_direct --config {cfg}\n"
        f"split: test-mini\nlimit: {LIMIT}\nbatch_size: 4\nmax_tokens: 256\nout: {tmp / 'out'}\n"
        "models:\n"
        f"  - {{name: oracle, kind: openai, base_url: '{base_url}', model: fake-model}}\n"
        f"  - {{name: keyless, kind: openai, base_url: '{base_url}', model: m, api_key_env: EVALS_TEST_UNSET_KEY}}\n"
    )
    return cfg


def test_optimal_plans_score_100(optimal_server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("EVALS_TEST_UNSET_KEY", raising=False)
    cfg = write_config(tmp_path, optimal_server.base_url)

    assert solve_direct.main(["--config", str(cfg), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"[plan] oracle: {LIMIT} of {LIMIT} test-mini instances" in err
    assert optimal_server.chat_requests == []  # the dry run called no model
    assert not (tmp_path / "out").exists()  # and wrote nothing

    assert solve_direct.main(["--config", str(cfg)]) == 0
    err = capsys.readouterr().err
    assert "[skip] keyless: model 'keyless' needs an API key: set EVALS_TEST_UNSET_KEY" in err
    rows = [json.loads(line) for line in open(tmp_path / "out" / "oracle" / "eval.jsonl")]
    assert len(rows) == LIMIT == len({r["id"] for r in rows})
    assert all(r["valid"] and r["optimal"] for r in rows), [r["failure"] for r in rows if not r["valid"]]
    table = {(r["arm"], r["subset"], r["metric"]): r for r in csv.DictReader(open(tmp_path / "out" / "table.csv"))
             if r["layout"] == "pooled"}
    assert float(table[("oracle", "all", "valid")]["mean"]) == 1.0
    assert float(table[("oracle", "all", "optimal")]["mean"]) == 1.0
    assert int(table[("oracle", "all", "valid")]["n_instances"]) == LIMIT
    assert float(table[("oracle", "all", "valid")]["ci95_high"]) == 1.0  # never above 100 %
    assert not any(m == "keyless" for (m, _, _) in table)
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| oracle | 1 | 100.0 [" in md and "`keyless` skipped: model 'keyless' needs an API key" in md
    timing = json.loads((tmp_path / "out" / "timings.json").read_text())["oracle"]
    assert timing["answered"] == LIMIT and timing["wall_s"] >= 0 and timing["machine"] == grid.machine()
    assert f"- Wall time on {grid.machine()}: oracle " in md

    # Resumable: drop the last 5 answers; the rerun asks exactly those 5 again.
    path = tmp_path / "out" / "oracle" / "eval.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-5]))
    asked = len(optimal_server.chat_requests)
    assert solve_direct.main(["--config", str(cfg)]) == 0
    assert len(optimal_server.chat_requests) - asked == 5
    assert sorted(json.loads(x)["id"] for x in path.read_text().splitlines()) == sorted(r["id"] for r in rows)
    # and a complete run asks nothing
    assert solve_direct.main(["--config", str(cfg)]) == 0
    assert len(optimal_server.chat_requests) - asked == 5
    assert "[skip] oracle: all 18 instances already answered" in capsys.readouterr().err


def test_wrong_answers_are_scored_as_failures(tmp_path):
    with FakeOpenAI(default="I cannot solve this.") as srv:
        cfg = write_config(tmp_path, srv.base_url)
        assert solve_direct.main(["--config", str(cfg)]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "out" / "oracle" / "eval.jsonl")]
    assert rows and all(not r["valid"] and r["failure"] == "parse_error" for r in rows)
    assert "| oracle | 1 | 0.0 [0.0," in (tmp_path / "out" / "table.md").read_text()


class EchoModel:
    """A chat model that answers every prompt with nothing usable (no model is loaded)."""

    def chat_batch(self, msgs, max_tokens, temperature):
        from types import SimpleNamespace

        return [SimpleNamespace(text="no plan", completion_tokens=2, latency_s=0.01, finish_reason="stop")
                for _ in msgs]


def test_local_checkpoint_paths_are_read_from_the_repo_root(tmp_path, monkeypatch):
    """A relative `checkpoint` / `base_model` names a folder under the repository root (like `out`), whatever
    the current directory; short names and Hugging Face ids pass through; base_model reaches open_policy."""
    import contextlib

    import llm_backends.policy

    opened = []

    @contextlib.contextmanager
    def fake_open_policy(checkpoint, backend="transformers", log_dir=None, *, base_model=None, **kw):
        opened.append((checkpoint, backend, base_model))
        yield EchoModel()

    monkeypatch.setattr(llm_backends.policy, "open_policy", fake_open_policy)
    monkeypatch.chdir(tmp_path)  # not the repo root
    cfg = tmp_path / "solve.yaml"
    cfg.write_text(
        f"# python -m evals.solve_direct --config {cfg}\nsplit: test-mini\nlimit: 4\nout: {tmp_path / 'out'}\n"
        "models:\n"
        "  - {name: adapter, kind: local, checkpoint: evals/configs, base_model: smollm2-135m}\n"
        "  - {name: hub, kind: local, checkpoint: Qwen/Qwen3-4B}\n"
    )
    assert solve_direct.main(["--config", str(cfg)]) == 0
    assert opened == [(str(config.REPO_ROOT / "evals" / "configs"), "transformers", "smollm2-135m"),
                      ("Qwen/Qwen3-4B", "transformers", None)]
    assert solve_direct.local_weights("evals/configs") == str(config.REPO_ROOT / "evals" / "configs")
    assert solve_direct.local_weights("smollm2-135m") == "smollm2-135m"
    assert solve_direct.local_weights(str(tmp_path)) == str(tmp_path)
    rows = [json.loads(line) for line in open(tmp_path / "out" / "adapter" / "eval.jsonl")]
    assert len(rows) == 4 and not any(r["valid"] for r in rows)
    assert set(json.loads((tmp_path / "out" / "timings.json").read_text())) == {"adapter", "hub"}


@pytest.mark.slow
def test_local_embedded_model_answers(tmp_path):
    """`kind: local` on the real embedded model: two instances, 8-token answers (about a minute on a busy
    2-core machine: the time is the model's load and two generations)."""
    cfg = tmp_path / "solve.yaml"
    cfg.write_text(
        f"# python -m evals.solve_direct --config {cfg}\nsplit: test-mini\nlimit: 2\nmax_tokens: 8\n"
        f"out: {tmp_path / 'out'}\nmodels:\n  - {{name: base, kind: local, checkpoint: smollm2-135m}}\n"
    )
    assert solve_direct.main(["--config", str(cfg)]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "out" / "base" / "eval.jsonl")]
    assert len(rows) == 2 and all(isinstance(r["valid"], bool) and "failure" in r for r in rows)
    assert all(0 < r["completion_tokens"] <= 8 for r in rows), rows
    assert json.loads((tmp_path / "out" / "base" / "metrics.json").read_text())
    timing = json.loads((tmp_path / "out" / "timings.json").read_text())["base"]
    assert timing["answered"] == 2 and timing["wall_s"] > 0 and timing["machine"] == grid.machine()
    assert "| base | " in (tmp_path / "out" / "table.md").read_text()


def _committed_cfg(tmp_path, models: str) -> Path:
    cfg = tmp_path / "solve.yaml"
    cfg.write_text("# python -m evals.solve_direct --config solve.yaml\nsplit: test-mini\nmax_tokens: 64\n"
                   f"out: evals/results/solve_direct_mini\nmodels:\n{models}")
    return cfg


def test_committed_results_are_never_added_to_without_out_or_fresh(tmp_path, capsys):
    """Reproduce on purpose: a model with answers left in a committed folder is refused in one line;
    --out DIR plans into DIR; --out with --fresh is refused; the committed folder is untouched."""
    from evals.solve_direct import main

    committed_dir = Path(__file__).resolve().parents[1] / "evals/results/solve_direct_mini"
    before = {p: p.stat().st_mtime_ns for p in committed_dir.rglob("*") if p.is_file()}
    cfg = _committed_cfg(tmp_path, "  - {name: another-run, kind: local, checkpoint: smollm2-135m}\n")
    assert main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds committed results" in err[0] and "--fresh" in err[0] and "another-run" in err[0]
    out = tmp_path / "repro"
    assert main(["--config", str(cfg), "--out", str(out), "--dry-run"]) == 0
    assert "[plan] another-run: 63 of 63 test-mini instances" in capsys.readouterr().err
    assert not out.exists()  # a dry run creates nothing
    assert main(["--config", str(cfg), "--out", str(out), "--fresh"]) == 2
    assert "--out and --fresh" in capsys.readouterr().err
    after = {p: p.stat().st_mtime_ns for p in committed_dir.rglob("*") if p.is_file()}
    assert after == before
