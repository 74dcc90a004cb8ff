"""mean@k beside the greedy answers: the evaluate node samples `eval_samples` answers per question at a temperature
through the same chat model, verifies them with the family's real verdicts (a scripted policy answers with the
solver's plan on a known share of its sampled calls per question), saves them, resumes without resampling, and
the metrics, report, plot points, engineer's table and TensorBoard carry the rate with an interval that counts
questions and samples. With sampling off nothing changes."""

from __future__ import annotations

import json
import math
import random
from collections import Counter, defaultdict

import pytest

from env import load_split, plan_text
from families.metrics import compute_metrics, mean_at_k_interval, sampled_metrics, wilson
from graph.settings import SettingsError, build_settings
from nodes.evaluate import evaluate, evaluate_start, final_evaluate, limit_instances, read_rows
from tests.support.node_helpers import make_settings, runtime, scripted_policy

K, T, N = 4, 0.9, 10


def _right(i: int) -> int:
    """How many of question i's K sampled answers are right: 0..K, in turn."""
    return i % (K + 1)


def _policy(instances):
    """Greedy (temperature 0): right on even questions. Sampled: right on the first `_right(i)` of question i's calls
    (every question is asked exactly K times, so its count is exact whatever the batching)."""
    asked: Counter = Counter()
    temperatures = []

    def answer(i, inst):
        t = policy.calls[-1][1]["temperature"]
        temperatures.append(t)
        if t == 0.0:
            return plan_text(inst.plan) if i % 2 == 0 else "no idea"
        asked[i] += 1
        return plan_text(inst.plan) if asked[i] <= _right(i) else "no idea"

    policy = scripted_policy(instances, answer)
    policy.temperatures = temperatures
    return policy


def _setup(tmp_path, **over):
    settings = make_settings(eval_limit=N, **over)
    instances = limit_instances(load_split(settings.eval_split), N)
    return settings, instances


def test_sampled_evaluation_scores_mean_at_k_per_level_with_its_interval_and_saves_the_answers(tmp_path):
    settings, instances = _setup(tmp_path, eval_samples=K, eval_sample_temperature=T)
    policy = _policy(instances)
    out = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=policy)
    m = out["metrics"]
    counts = [_right(i) for i in range(N)]
    assert m["eval/sampled_valid_rate"] == sum(counts) / (K * N) == 0.5
    assert m["eval/samples_k"] == K and m["eval/sample_temperature"] == T and m["eval/sampled_n"] == K * N
    assert m["eval/valid_rate"] == 0.5  # the greedy answers, scored as before
    by_level = defaultdict(list)
    for i, inst in enumerate(instances):
        by_level[inst.size].append(_right(i))
    for level, c in by_level.items():
        assert m[f"eval/sampled_valid_rate/level_{level}"] == sum(c) / (K * len(c))
        row = m["by_level"][str(level)]
        assert row["sampled_valid_rate"] == sum(c) / (K * len(c)) and row["sampled_n"] == K * len(c)
        assert row["sampled_low"] <= row["sampled_valid_rate"] <= row["sampled_high"]
    # the interval from the spread of per-question rates: 10 questions, rates 0, .25, .5, .75, 1 twice each
    rates = [c / K for c in counts]
    var_mean = sum((r - 0.5) ** 2 for r in rates) / (N - 1) / N
    trials = 0.25 / var_mean  # the effective number of answers, between N and N x K
    assert N < trials < N * K
    lo, hi = m["eval/sampled_valid_rate_low"], m["eval/sampled_valid_rate_high"]
    assert (lo, hi) == pytest.approx(wilson_rate(0.5, trials))
    assert hi - lo > (lambda w: w[1] - w[0])(wilson(N * K // 2, N * K))  # wider than if the 40 were independent
    # every sampled call at the temperature, K per question, and the greedy ones at 0
    assert Counter(policy.temperatures) == {0.0: N, T: K * N}
    # the saved answers: one row per question x sample, and the figures recomputed from them
    sdir = tmp_path / "stage_1"
    saved = read_rows(sdir / "eval_sampled.jsonl")
    assert [(r["id"], r["sample"]) for r in saved] == [(inst.id, s) for inst in instances for s in range(K)]
    assert all(r["level"] == inst.size for r, inst in zip(saved[::K], instances, strict=True))
    assert [sum(r["valid"] for r in saved[i * K:(i + 1) * K]) for i in range(N)] == counts
    greedy = compute_metrics(read_rows(sdir / "eval.jsonl"))
    assert sampled_metrics(greedy, saved, K, T) == json.loads((sdir / "metrics.json").read_text()) == m
    assert json.loads((sdir / "eval_sampled.key.json").read_text())["samples_k"] == K
    assert "sampled valid 0.500 (mean@4)" in out["log"][-1]


def test_the_warm_start_and_the_final_evaluation_are_sampled_too(tmp_path):
    """The start row a stage's sampled rate is read against, and the held-out split, carry mean@k as every stage does."""
    settings, instances = _setup(tmp_path, eval_samples=K, eval_sample_temperature=T, final_limit=N)
    (tmp_path / "warm").mkdir()
    start = evaluate_start(tmp_path / "run", {"sft/cache_path": str(tmp_path / "warm")}, settings,
                           model=_policy(instances))
    assert start["eval/sampled_valid_rate"] == 0.5 and start["eval/samples_k"] == K and start["eval/valid_rate"] == 0.5
    assert len(read_rows(tmp_path / "run" / "stage_0" / "start" / "eval_sampled.jsonl")) == K * N
    held_out = limit_instances(load_split(settings.final_split), N)
    out = final_evaluate({"checkpoint": None}, runtime(settings, tmp_path / "run"), model=_policy(held_out))
    final = out["final_metrics"]
    assert final["final/sampled_valid_rate"] == 0.5 and final["final/samples_k"] == K
    assert final["final/valid_rate"] == 0.5 and "sampled valid 0.500 (mean@4)" in out["log"][0]
    assert json.loads((tmp_path / "run" / "final" / "metrics.json").read_text()) == final
    off = final_evaluate({"checkpoint": None}, runtime(make_settings(final_limit=N), tmp_path / "off"),
                         model=_policy(held_out))["final_metrics"]
    assert "final/sampled_valid_rate" not in off and not (tmp_path / "off" / "final" / "eval_sampled.jsonl").exists()


def test_a_level_share_runs_report_shows_the_final_sampled_rate_per_level():
    from nodes.report import render

    levels = [{"index": i, "label": f"level {i}", "column": f"L{i}"} for i in range(2)]
    final = {"final/n": 4, "final/valid_rate": 0.5, "final/samples_k": 4, "final/sample_temperature": 0.7,
             "final/sampled_valid_rate": 0.375, "final/sampled_valid_rate_low": 0.2, "final/sampled_valid_rate_high": 0.6,
             "by_level": {"0": {"n": 2, "valid_rate": 1.0, "sampled_valid_rate": 0.625},
                          "1": {"n": 2, "valid_rate": 0.0, "sampled_valid_rate": 0.125}}}
    data = {"lever": "levels", "levels": levels, "final": final, "stages": [], "settings": {"final_split": "test"}}
    text = render(data, [], "rg")
    assert "4 questions: valid 50.0 %, sampled valid 37.5 [20-60] % (mean@4 at temperature 0.7)." in text
    assert "| L0 | level 0 | 2 | 100.0 | 62.5 |" in text and "| L1 | level 1 | 2 | 0.0 | 12.5 |" in text
    plain = render({**data, "final": {k: v for k, v in final.items() if "sampl" not in k}}, [], "rg")
    assert "| level | what | n | valid % |\n" in plain and "sampled" not in plain.split("## Final")[1]


def wilson_rate(p: float, n: float, z: float = 1.959964) -> tuple[float, float]:
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (centre - half, centre + half)


def test_with_sampling_off_nothing_changes(tmp_path):
    settings, instances = _setup(tmp_path)
    assert settings.eval_samples == 0
    policy = _policy(instances)
    m = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=policy)["metrics"]
    assert not [k for k in m if "sampl" in k] and not [k for r in m["by_level"].values() for k in r if "sampl" in k]
    assert m == compute_metrics(read_rows(tmp_path / "stage_1" / "eval.jsonl"))
    assert set(policy.temperatures) == {0.0} and len(policy.temperatures) == N
    assert not list((tmp_path / "stage_1").glob("eval_sampled*"))


def test_a_resumed_evaluation_keeps_its_samples_and_a_new_temperature_samples_again(tmp_path):
    settings, instances = _setup(tmp_path, eval_samples=K, eval_sample_temperature=T)
    first = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=_policy(instances))
    again = _policy(instances)
    second = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=again)
    assert again.calls == [] and second["metrics"] == first["metrics"]  # nothing asked again, greedy or sampled
    # an evaluation cut off mid-way: the journal holds the first 13 answers, only the other 27 are asked
    sdir = tmp_path / "stage_1"
    saved = (sdir / "eval_sampled.jsonl").read_text().splitlines()
    key = json.loads((sdir / "eval_sampled.key.json").read_text())
    (sdir / "eval_sampled.key.json").unlink()
    (sdir / "eval_sampled.jsonl").unlink()
    (sdir / "eval_sampled.partial.jsonl").write_text("\n".join([json.dumps({"key": key}), *saved[:13], '{"id": "cut']))
    resumed = _policy(instances)
    third = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path), model=resumed)
    assert Counter(resumed.temperatures) == {T: K * N - 13}
    assert len(read_rows(sdir / "eval_sampled.jsonl")) == K * N and not (sdir / "eval_sampled.partial.jsonl").exists()
    assert third["metrics"]["eval/sampled_n"] == K * N
    # another temperature is another evaluation: every sample asked again, the greedy answers kept
    hotter = _policy(instances)
    evaluate({"stage": 1, "checkpoint": None},
             runtime(make_settings(eval_limit=N, eval_samples=K, eval_sample_temperature=1.2), tmp_path), model=hotter)
    assert Counter(hotter.temperatures) == {1.2: K * N}


def test_the_interval_counts_questions_and_samples():
    """Clustered samples (half the questions nearly always right, half nearly never): over 400 simulated
    evaluations the interval holds the true mean@4 about 95 % of the time, where a Wilson interval over the
    n x k answers, as if they were independent, misses about a third of the time."""
    rng = random.Random(0)
    n, k, truth, hits, naive = 30, 4, 0.5, 0, 0
    for _ in range(400):
        easy = [rng.random() < 0.5 for _ in range(n)]  # each question's rate: 0.95 or 0.05
        counts = [sum(rng.random() < (0.95 if e else 0.05) for _ in range(k)) for e in easy]
        lo, hi = mean_at_k_interval(counts, k)
        hits += lo <= truth <= hi
        wlo, whi = wilson(sum(counts), n * k)
        naive += wlo <= truth <= whi
    assert hits / 400 >= 0.90 and naive / 400 <= 0.80
    # independent samples (every question alike): about as narrow as Wilson's over the n x k answers
    assert mean_at_k_interval([2] * 30, 4) == pytest.approx(wilson(60, 120))
    # nothing right anywhere: the n questions are the trials
    assert mean_at_k_interval([0] * 30, 4) == pytest.approx(wilson(0, 30))


def test_report_plot_and_engineer_table_show_the_sampled_rate(tmp_path):
    from families.views import MapfView, rates_table
    from nodes.report import collect, render
    from nodes.report_plots import stage_points

    settings, instances = _setup(tmp_path, eval_samples=K, eval_sample_temperature=T)
    m = evaluate({"stage": 0, "checkpoint": None}, runtime(settings, tmp_path), model=_policy(instances))["metrics"]
    lo, hi = m["eval/sampled_valid_rate_low"], m["eval/sampled_valid_rate_high"]
    text = render(collect(tmp_path), [], "t")
    assert "| stage | valid % | sampled valid % | optimal % |" in text
    assert f"| 0 | 50.0 | 50.0 [{100 * lo:.0f}-{100 * hi:.0f}] | " in text and "mean@4" in text
    pts = stage_points([{"stage": 0, "metrics": m}], None, "sampled_valid_rate")
    assert pts[0]["rate"] == 50.0 and (pts[0]["low"], pts[0]["high"]) == pytest.approx((100 * lo, 100 * hi))
    table = rates_table(MapfView(), m)
    row = m["by_level"][str(instances[0].size)]
    assert "sampled valid" in table.splitlines()[0]
    assert f"{100 * row['sampled_valid_rate']:.1f}% [{100 * row['sampled_low']:.0f}-{100 * row['sampled_high']:.0f}]" \
        in table
    off, _ = _setup(tmp_path)
    evaluate({"stage": 0, "checkpoint": None}, runtime(off, tmp_path), model=_policy(instances))
    text = render(collect(tmp_path), [], "t")
    assert "| stage | valid % | optimal % |" in text and "sampled" not in text


def test_tensorboard_gets_the_sampled_scalars(tmp_path):
    from graph import tracking
    from tests.support.graph_stubs import settings_for
    from tests.test_tracking import scalars

    settings, run_dir = settings_for(tmp_path, stages=2)
    rows = [{"id": q, "sample": s, "level": 3, "valid": s < 2} for q in "ab" for s in range(K)]
    metrics = sampled_metrics(compute_metrics([{"level": 3, "valid": True}]), rows, K, T)
    tracker = tracking.LoopTracker(run_dir, settings)
    tracker.on_evaluate(0, metrics)
    tracker.close()
    tags = scalars(run_dir / "tb")
    assert [v for _, v in tags["eval/sampled_valid_rate"]] == [0.5]
    assert [v for _, v in tags["eval/sampled_valid_rate/level_3"]] == [0.5]
    assert [v for _, v in tags["eval/samples_k"]] == [K] and "by_stage/eval/sampled_valid_rate" in tags


@pytest.mark.parametrize("given, allowed", [({"eval_samples": "-1"}, "greater than or equal to 0"),
                                            ({"eval_samples": "2.5"}, "integer"),
                                            ({"eval_sample_temperature": "0"}, "greater than 0")])
def test_bad_sampling_settings_are_one_line(given, allowed):
    with pytest.raises(SettingsError) as e:
        build_settings(given, env={})
    assert allowed in str(e.value) and "\n" not in str(e.value) and next(iter(given)) in str(e.value)


def test_presets_rg_cpu_samples_at_its_training_temperature():
    from graph.progress import describe_start
    from graph.run import preset_help

    s = build_settings({"preset": "rg-cpu"}, env={})
    assert s.eval_samples == 4 and s.sample_temperature == s.train.temperature == 0.7
    assert "4 sampled answers a question" in describe_start("evaluate", {"stage": 1}, s)
    assert "sampled at 0.7 (mean@4)" in " ".join(preset_help().split())
    assert build_settings({"preset": "cpu"}, env={}).eval_samples == 0
    assert build_settings({"preset": "rg-cpu", "eval_samples": "none"}, env={}).eval_samples == 0


@pytest.mark.slow
def test_the_real_policy_samples_through_the_same_model_and_a_resume_opens_nothing(embedded_model_path, tmp_path,
                                                                                   monkeypatch):
    """The embedded model, in-process: the greedy and the sampled answers come from the policy the evaluation opens
    (`policy_opener`), K per question, verified; evaluating again reuses both files and opens no policy."""
    import llm_backends.policy as lp

    settings = make_settings(eval_limit=3, eval_samples=2, eval_max_tokens=8, policy_backend="transformers",
                             policy_model=str(embedded_model_path))
    m = evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path))["metrics"]
    saved = read_rows(tmp_path / "stage_1" / "eval_sampled.jsonl")
    assert len(saved) == 6 == m["eval/sampled_n"] and {r["sample"] for r in saved} == {0, 1}
    assert all(isinstance(r["text"], str) and r["completion_tokens"] <= 8 for r in saved)
    assert m["eval/sample_temperature"] == settings.train.temperature and 0.0 <= m["eval/sampled_valid_rate"] <= 1.0

    def refuse(*a, **kw):
        raise AssertionError("a resumed evaluation opened the policy")

    monkeypatch.setattr(lp, "open_policy", refuse)
    assert evaluate({"stage": 1, "checkpoint": None}, runtime(settings, tmp_path))["metrics"] == m
