"""`--jobs N`: a grid's graph.run calls N at a time, each pinned to its own share of the cores.

Fast: the core split and the refusals. Slow: a real smoke grid with --jobs 2 (engineers `fixed` and `random`,
seeds 0 and 1, stage 0 shared): the two stage-0 donors run at once on one core each, and each fork starts
from its own seed's donor."""

from __future__ import annotations

import json
import os
import re

import pytest

from evals.config import EvalConfigError
from evals.grid import jobs_cores
from tests.support.cores import all_cores, on_all_cores
from tests.support.smoke_grid import SHRINK, evals_cmd


def test_cores_are_split_into_equal_slots(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert jobs_cores(1) is None  # one run on every core, as before
    assert jobs_cores(2) == [[0, 1], [2, 3]]
    assert jobs_cores(5) == [[0], [1], [2], [3], [4]]
    with pytest.raises(EvalConfigError, match=r"--jobs 6: this process may use 5 core\(s\); allowed: 1 to 5"):
        jobs_cores(6)


def test_bad_jobs_is_one_error_line_before_anything_runs(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"# python -m evals.compare_engineers --config {cfg}\npreset: smoke\nengineers: [fixed]\n"
                   f"seeds: [0]\nout: {tmp_path / 'out'}\nruns_dir: {tmp_path / 'runs'}\n")
    too_many = len(os.sched_getaffinity(0)) + 1
    for bad, said in ((str(too_many), f"--jobs {too_many}: this process may use"), ("0", "--jobs 0: allowed")):
        proc = evals_cmd("evals.compare_engineers", cfg, "--dry-run", "--jobs", bad, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {said}"), proc.stderr[-500:]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.skipif(len(all_cores()) < 2, reason="needs 2 usable cores")
def test_jobs_2_runs_the_donors_at_once_pinned_and_forks_from_them(tmp_path, embedded_model_path, monkeypatch):
    """What is checked is the scheduling, never what a policy answers: the policy is a two-block random Llama
    with the embedded model's tokenizer (tests/support/tiny_llama.py), with a model cache of its own."""
    from tests.support.tiny_llama import save_tiny_llama

    policy = save_tiny_llama(tmp_path / "tiny-llama", embedded_model_path)
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    shrink = SHRINK.rstrip().removesuffix("}") + f", policy_model: {policy}}}\n"
    cfg = tmp_path / "compare.yaml"
    cfg.write_text(f"# python -m evals.compare_engineers --config {cfg} --jobs 2\npreset: smoke\n"
                   f"engineers: [fixed, random]\nseeds: [0, 1]\nbaseline: fixed\nshare_stage0: true\n"
                   f"out: {tmp_path / 'out'}\nruns_dir: {tmp_path / 'runs'}\n{shrink}")
    with on_all_cores():  # a parallel test worker has one core of its own: the grid pins its runs on two
        proc = evals_cmd("evals.compare_engineers", cfg, "--jobs", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = (tmp_path / "out" / "events.log").read_text().splitlines()
    starts = [(m.group(1), m.group(2)) for ln in events if (m := re.search(r"\[start\] (\S+) \(cores (\S+)\)", ln))]
    assert {n for n, _ in starts} == {"fixed-s0", "fixed-s1", "random-s0", "random-s1"}, events
    # the two donors (one per seed) started before anything finished, each on a core of its own
    first_done = next(i for i, ln in enumerate(events) if "[done]" in ln)
    early = [m.group(1, 2) for ln in events[:first_done] if (m := re.search(r"\[start\] (\S+) \(cores (\S+)\)", ln))]
    assert {n for n, _ in early} == {"fixed-s0", "fixed-s1"} and {c for _, c in early} == {"0", "1"}, events
    timings = json.loads((tmp_path / "out" / "timings.json").read_text())
    for seed in (0, 1):
        assert timings[f"random-s{seed}"]["stage0_from"].endswith(f"fixed-s{seed}")  # its own seed's donor
        for arm in ("fixed", "random"):
            t = timings[f"{arm}-s{seed}"]
            assert t["jobs"] == 2 and t["last_rc"] == 0
            settings = json.loads((tmp_path / "runs" / f"{arm}-s{seed}" / "settings.json").read_text())
            assert settings["provenance"]["machine"]["cores_usable"] == 1  # pinned: graph.run saw one core
            assert settings["policy_model"] == str(policy)
    assert (tmp_path / "out" / "table.md").is_file()
