"""`python -m evals.bench.bench_learning --pool` and `--resume`: the seeds of several runs of one experiment, one
interval; a stopped bench keeps its finished seeds."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from evals.bench.bench_learning import main, parse_holes, pool, summarize, training_draw
from evals.intervals import crossed_interval
from evals.packed import read_text

RESULTS = Path(__file__).resolve().parents[1] / "evals" / "results" / "learning_cpu"
PACKED = RESULTS / "answers.tar.xz"  # the folder's benchmark files, packed (evals.packed)


def _run(seed: int, gain_bias: float) -> dict:
    rng = random.Random(seed)
    diffs = [1 if rng.random() < 0.1 + gain_bias else (-1 if rng.random() < 0.1 else 0) for _ in range(150)]
    return {"seed": seed, "gain": sum(diffs) / 150, "diffs": diffs, "valid_rate": 0.2, "by_level": {"3": 0.2},
            "train/zero_std_groups_trained": 0.5}


def _file(tmp_path, name, seeds, **over):
    head = {"preset": "cpu", "split": "val-small", "instances": 150, "grpo_sizes": [3, 4],
            "train_config": {"max_steps": 48}, "warm_start": {"key": "abc", "valid_rate": 0.16, "by_level": {"3": 0.26}}}
    head.update(over)
    path = tmp_path / name
    path.write_text(json.dumps(summarize(head, [_run(s, 0.05) for s in seeds])))
    return path


def test_pooled_interval_is_the_two_way_bootstrap_over_every_seed(tmp_path):
    a, b = _file(tmp_path, "a.json", [0, 1, 2]), _file(tmp_path, "b.json", [3, 4])
    s = pool([a, b])
    runs = [_run(k, 0.05) for k in range(5)]
    assert [r["seed"] for r in s["seeds"]] == [0, 1, 2, 3, 4]
    assert s["mean_gain"] == pytest.approx(sum(r["gain"] for r in runs) / 5)
    assert s["gain_interval_bootstrap_95"] == list(crossed_interval([r["diffs"] for r in runs]))
    assert "two-way" in s["interval"]
    assert s["warm_start"]["key"] == "abc" and s["pooled_from"] == [str(a), str(b)]


@pytest.mark.parametrize("over,msg", [
    ({"warm_start": {"key": "other"}}, "warm start other differs"),
    ({"grpo_sizes": [3, 4, 5]}, "grpo_sizes differs"),
    ({"grpo_holes": [0.1, 0.3]}, r"grpo_holes differs from .*\(\[0.1, 0.3\] vs \[0.2\]\)"),
    ({"train_config": {"max_steps": 24}}, "train_config differs"),
])
def test_different_experiments_are_refused_by_name(tmp_path, over, msg):
    a, b = _file(tmp_path, "a.json", [0]), _file(tmp_path, "b.json", [1], **over)
    with pytest.raises(ValueError, match=msg):
        pool([a, b])


def test_the_table_gives_the_gain_within_each_hole_ratio_of_the_evaluation_maps():
    from evals.bench.bench_learning import table

    head = {"split": "val-small", "instances": 4, "eval_holes": [0.1, 0.2, 0.1, 0.2],
            "warm_start": {"by_level": {"3": 0.5}, "valid_rate": 0.5}}
    runs = [{"seed": 0, "gain": 0.0, "diffs": [1, 0, 1, -1], "by_level": {"3": 0.5}, "valid_rate": 0.5},
            {"seed": 1, "gain": 0.0, "diffs": [0, -1, 1, 0], "by_level": {"3": 0.5}, "valid_rate": 0.5}]
    text = table(summarize(head, runs))
    # 0.1: diffs 1, 1, 0, 1 over both seeds -> +75.0; 0.2: 0, -1, -1, 0 -> -50.0
    assert "mean gain by the evaluation maps' hole ratio: 0.1: +75.0 (2), 0.2: -50.0 (2)" in text
    assert "hole ratio" not in table(summarize({**head, "eval_holes": None}, runs))


def test_a_file_from_before_grpo_holes_pools_with_the_hole_ratio_it_trained_on(tmp_path):
    a = _file(tmp_path, "a.json", [0])  # no grpo_holes: trained on hole 0.2
    b = _file(tmp_path, "b.json", [1], grpo_holes=[0.2])
    assert [r["seed"] for r in pool([a, b])["seeds"]] == [0, 1]


def test_training_draw_spreads_hole_ratios_as_asked_and_one_ratio_is_the_old_draw():
    from env import SIZES, EnvConfig, generate

    old = generate(EnvConfig.model_validate({"sizes": {
        s: {"data_ratio": 1 / 3 if s in (3, 4, 5) else 0.0, "hole_ratio": 0.2, "wait_ratio": 0.5} for s in SIZES}}),
        12, seed=2000 + 1).instances
    assert [x.to_json() for x in training_draw({3, 4, 5}, 12, 1)] == [x.to_json() for x in old]
    mixed = training_draw({3, 4, 5}, 11, 1, (0.1, 0.3, 0.5))
    assert len(mixed) == 11 and len({x.id for x in mixed}) == 11
    holes = [sum(row.count("H") for row in x.grid) / x.size ** 2 for x in mixed]
    # shares 4 / 4 / 3, interleaved: 0.1, 0.3, 0.5, 0.1, ...; 0.5 is capped at 0.33 on 3x3 (env.max_hole_ratio)
    low, mid, high = holes[0::3], holes[1::3], holes[2::3]
    assert max(low) < min(high) and sum(low) / len(low) < sum(mid) / len(mid) < sum(high) / len(high)
    assert training_draw({3, 4, 5}, 11, 1, (0.1, 0.3, 0.5)) == mixed  # seeded
    for bad in ("0.7", "x", ""):
        with pytest.raises(ValueError, match=f"--grpo-holes {bad!r}: allowed: hole ratios in \\[0, 0.5\\]"):
            parse_holes(bad)


def test_a_setting_added_since_a_file_was_written_counts_at_its_default(tmp_path):
    from trainer.config import TrainConfig

    now = TrainConfig().model_dump(mode="json")
    before = {k: v for k, v in now.items() if k != "share_prompt"}  # a file from before the setting existed
    a = _file(tmp_path, "a.json", [0], train_config=before)
    b = _file(tmp_path, "b.json", [1], train_config=now)
    assert [r["seed"] for r in pool([a, b])["seeds"]] == [0, 1]
    c = _file(tmp_path, "c.json", [2], train_config={**now, "share_prompt": False})
    with pytest.raises(ValueError, match=r"c.json: train_config differs .*\(share_prompt: False vs True\)"):
        pool([a, c])


def test_a_removed_lever_recorded_off_pools_and_recorded_on_does_not(tmp_path):
    from trainer.config import TrainConfig

    now = TrainConfig().model_dump(mode="json")
    a = _file(tmp_path, "a.json", [0], train_config={**now, "sft_mix": 0.0, "localize_credit": False})
    b = _file(tmp_path, "b.json", [1], train_config=now)
    assert [r["seed"] for r in pool([a, b])["seeds"]] == [0, 1]
    c = _file(tmp_path, "c.json", [2], train_config={**now, "sft_mix": 0.5})
    with pytest.raises(ValueError, match=r"c.json: train_config differs .*\(sft_mix: 0.5 vs None\)"):
        pool([b, c])


def test_old_files_and_repeated_seeds_are_refused(tmp_path, capsys):
    a = _file(tmp_path, "a.json", [0, 1])
    old = json.loads(a.read_text())
    for r in old["seeds"]:
        del r["diffs"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"seeds \[0, 1\] have no per-instance answers"):
        pool([a, tmp_path / "old.json"])
    with pytest.raises(ValueError, match="a seed appears twice"):
        pool([a, _file(tmp_path, "b.json", [1, 2])])
    with pytest.raises(SystemExit):
        main(["--pool", str(a), str(tmp_path / "missing.json")])
    assert "--pool" in capsys.readouterr().err
    out = tmp_path / "pooled.json"
    main(["--pool", str(a), str(_file(tmp_path, "c.json", [5])), "--json", str(out)])
    assert [r["seed"] for r in json.loads(out.read_text())["seeds"]] == [0, 1, 5]


def test_one_key_with_other_weights_or_other_start_scores_is_refused(tmp_path):
    # one warm-start key with other weights (built elsewhere, or with other code): not one experiment
    ws = {"key": "abc", "valid_rate": 0.16, "by_level": {"3": 0.26}}
    intel = {**ws, "weights": {"model.safetensors": "e5f0614f" + "0" * 56}, "built_on": "Intel(R) Xeon(R) Processor"}
    amd = {**ws, "weights": {"model.safetensors": "98aa0000" + "0" * 56}, "built_on": "AMD EPYC"}
    a, b = _file(tmp_path, "a.json", [0], warm_start=intel), _file(tmp_path, "b.json", [1], warm_start=amd)
    refused = r"other weights .*98aa00000000 built on AMD EPYC, against .*e5f0614f0000 built on Intel"
    with pytest.raises(ValueError, match=refused):
        pool([a, b])
    assert [r["seed"] for r in pool([a, _file(tmp_path, "c.json", [2], warm_start=intel)])["seeds"]] == [0, 2]
    # files that do not record the weights: the start's own greedy answers before training must agree
    old = _file(tmp_path, "old.json", [3], warm_start={"key": "abc", "valid_rate": 0.1267, "by_level": {"3": 0.2}})
    with pytest.raises(ValueError, match=r"scored 12.7 % \{'3': 0.2\} before training, against 16.0 %"):
        pool([a, old])
    assert len(pool([a, _file(tmp_path, "d.json", [4], warm_start=ws)])["seeds"]) == 2


def test_resume_needs_its_file_and_refuses_another_experiment(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--resume"])
    assert "--resume: needs --json FILE" in capsys.readouterr().err
    # a file of another experiment (here: other settings) is refused before any training, by name
    other = _file(tmp_path, "other.json", [0])
    with pytest.raises(SystemExit):
        main(["--grpo-sizes", "3,4", "--json", str(other), "--resume"])
    assert "--resume: " in (err := capsys.readouterr().err) and "train_config differs" in err
    from trainer.config import TRAIN_PRESETS, TrainConfig

    other_cfg = TrainConfig.model_validate(TRAIN_PRESETS["cpu"]).model_dump(mode="json")  # this run's own settings
    old = json.loads(_file(tmp_path, "old.json", [0], grpo_sizes=[3, 4, 5]).read_text())
    del old["seeds"][0]["diffs"]  # no per-instance answers: the interval could not be recomputed after a new seed
    (tmp_path / "old.json").write_text(json.dumps({**old, "train_config": other_cfg}))
    with pytest.raises(SystemExit):  # answered by transformers' generate, as every file before --sampler
        main(["--json", str(tmp_path / "old.json"), "--resume", "--sampler", "vllm"])
    assert "--resume: " in (err := capsys.readouterr().err) and "sampler differs" in err
    with pytest.raises(SystemExit):
        main(["--json", str(tmp_path / "old.json"), "--resume", "--sampler", "generate"])
    assert "--resume: " in (err := capsys.readouterr().err) and "seeds [0] have no per-instance answers" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"preset": ')  # half-written by hand: the writer itself never leaves one
    with pytest.raises(SystemExit):
        main(["--json", str(broken), "--resume"])
    assert "--resume: " in capsys.readouterr().err


@pytest.mark.slow
def test_every_finished_seed_is_kept_and_resumed(embedded_model_path, tmp_path, monkeypatch, capsys):
    """The real bench, tiny: the file is written after each seed (not only at the end), and --resume trains only
    the seeds it lacks, keeping the others' figures as they were. Its policy is a two-block random Llama with the
    embedded model's tokenizer: what is checked is the bookkeeping, never what the model answers."""
    import evals.bench.bench_learning as bench
    from tests.support.tiny_llama import save_tiny_llama

    policy = save_tiny_llama(tmp_path / "tiny", embedded_model_path)
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("llm_backends.models.resolve_model", lambda name, cache_dir=None: policy)
    out, answers = tmp_path / "bench.json", tmp_path / "answers.jsonl"
    args = ["--preset", "smoke", "--quick", "--per-size", "1", "--json", str(out), "--answers", str(answers),
            "--keep-checkpoints", str(tmp_path / "kept")]

    def stopped(summary):  # the bench dies after its last seed, before its final summary
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "table", stopped)
    with pytest.raises(KeyboardInterrupt):
        bench.main([*args, "--seeds", "0"])
    first = json.loads(out.read_text())
    assert [r["seed"] for r in first["seeds"]] == [0] and len(first["seeds"][0]["diffs"]) == 3
    monkeypatch.undo()
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("llm_backends.models.resolve_model", lambda name, cache_dir=None: policy)
    capsys.readouterr()
    bench.main([*args, "--seeds", "0,1", "--resume"])
    printed = capsys.readouterr().out
    assert "seeds [0] kept, [1] to train" in printed and "\nseed 0 " not in printed and "\nseed 1 " in printed
    assert "warm start: greedy answers reused from" in printed  # the first run kept them (evals/bench/start_answers)
    final = json.loads(out.read_text())
    assert [r["seed"] for r in final["seeds"]] == [0, 1]
    assert final["seeds"][0] == first["seeds"][0]  # not retrained: its timing figures are the first run's, exactly
    assert final["mean_gain"] == pytest.approx((final["seeds"][0]["gain"] + final["seeds"][1]["gain"]) / 2)
    assert not list(tmp_path.glob("*.tmp"))
    # --answers: every greedy answer of the start (once per run) and of each trained seed, verdicts as in the figures
    lines = [json.loads(x) for x in answers.read_text().splitlines()]
    assert [x["who"] for x in lines] == ["warm start"] * 3 + [0] * 3 + ["warm start"] * 3 + [1] * 3
    assert [x["id"] for x in lines[3:6]] == [x["id"] for x in lines[:3]] and all("answer" in x for x in lines)
    assert lines[6:9] == lines[:3]  # the reused start answers, verified again, are the ones it gave
    seed1 = [x["failure"] is None for x in lines[9:]]
    start = [x["failure"] is None for x in lines[6:9]]
    assert [int(a) - int(b) for a, b in zip(seed1, start, strict=True)] == final["seeds"][1]["diffs"]
    # --keep-checkpoints: each trained seed's weights, whole and loadable, after the stage's temporary folder is gone
    from llm_backends.checkpoints import check_checkpoint

    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["seed_0", "seed_1"]
    for p in (tmp_path / "kept").iterdir():
        check_checkpoint(p)


def test_stop_bias_raises_the_line_end_only_after_a_closed_cell(embedded_model_path):
    """`probe_stop_bias.StopBias` on the real tokenizer: the line end's logit moves by the bias in the rows whose
    last token closes a cell, and nowhere else."""
    import torch
    from transformers import AutoTokenizer

    from evals.bench.probe_stop_bias import StopBias

    tok = AutoTokenizer.from_pretrained(embedded_model_path)
    ids = [tok("Agent 0: (0,0)", add_special_tokens=False)["input_ids"],
           tok("Agent 0: (0,", add_special_tokens=False)["input_ids"]]
    assert tok.decode(ids[0][-1:]) == ")" and len(ids[0]) > len(ids[1])
    batch = torch.tensor([ids[0], [tok.pad_token_id or 0] * (len(ids[0]) - len(ids[1])) + ids[1]])
    scores = torch.zeros(2, len(tok))
    out = StopBias(tok, 1.5)(batch, scores.clone())
    (end,) = tok("\n", add_special_tokens=False)["input_ids"]
    assert out[0, end] == 1.5 and int(out[0].argmax()) == end
    assert (out[0] != 0).sum() == 1 and (out[1] == 0).all()


def test_stop_bias_agreement_counts_same_direction_flips_only():
    from evals.bench.probe_stop_bias import agreement

    bias = [1, -1, 0, 0, 1]
    seeds = [[1, 1, 0, -1, 0], [0, -1, 1, 0, 1]]
    # seed flips: 3 + 3 = 6; the same way as the bias: (0 in seed 0) + (1, 4 in seed 1) = 3
    # bias flips: 3 per seed, 6 in all; shared: 3
    assert agreement(bias, seeds) == {"seed_flips_matched": 0.5, "bias_flips_shared": 0.5}
    assert math.isnan(agreement([0] * 5, seeds)["bias_flips_shared"])  # a bias that flips nothing shares nothing


def test_stop_bias_cli_names_a_bad_bias(capsys, tmp_path):
    from evals.bench.probe_stop_bias import main

    with pytest.raises(SystemExit):
        main(["--bias", "0.5,high"])
    assert "--bias '0.5,high'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--sampled", "-2"])
    assert "--sampled -2: expected 0 (off)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--runs", str(tmp_path / "a.json"), "--checkpoint", str(tmp_path)])
    assert "--runs with --checkpoint" in capsys.readouterr().err
    (tmp_path / "half.json").write_text('{"seeds": ')
    with pytest.raises(SystemExit):  # stops before any model work
        main(["--runs", str(tmp_path / "half.json")])
    assert f"--runs {tmp_path / 'half.json'}: not a readable bench_learning JSON file" in capsys.readouterr().err


@pytest.mark.parametrize("item, says", [
    ("top_p=2", "--set top_p=2: Input should be less than or equal to 1"),
    ("temperature=-0.5", "--set temperature=-0.5: Input should be greater than 0"),
    ("learning_rate=fast", "--set learning_rate='fast': Input should be a valid number"),
])
def test_bench_set_names_a_bad_value_in_one_line(capsys, item, says):
    from evals.bench.bench_learning import main

    with pytest.raises(SystemExit):
        main([arg for one in item.split() for arg in ("--set", one)])
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_training_draw_keeps_only_long_plans_when_asked_and_refuses_the_impossible():
    """`--grpo-min-makespan`: every instance drawn has at least that optimal makespan, the draw is seeded and
    spread over the sizes asked, 0 is the old draw, and a makespan no map of these sizes reaches is one clear error."""
    long = training_draw({3, 4, 5}, 12, 1, min_makespan=4)
    assert len(long) == 12 and len({x.id for x in long}) == 12
    assert min(x.optimal_makespan for x in long) >= 4
    assert min(x.optimal_makespan for x in training_draw({3, 4, 5}, 12, 1)) < 4  # the filter did something
    assert training_draw({3, 4, 5}, 12, 1, min_makespan=4) == long
    assert [x.size for x in long] == [x.size for x in training_draw({3, 4, 5}, 12, 1)]  # the plain draw's sizes
    assert [x.to_json() for x in training_draw({3}, 6, 1, min_makespan=0)] == \
        [x.to_json() for x in training_draw({3}, 6, 1)]
    with pytest.raises(ValueError, match=r"--grpo-min-makespan 40: found only \{3: '0 of 2'\} instances .* allowed: a smaller"):
        training_draw({3}, 2, 1, min_makespan=40)


def test_a_kept_start_answer_set_is_reused_only_for_its_spec_and_always_verified_again(tmp_path, monkeypatch):
    """`evals.bench.start_answers`: the start's greedy answers, kept per (weights, split, limit, prompt, machine), come
    back with the figures `trainer.greedy.score_texts` gives them now; another spec, another split or a broken file
    answers again (None); a kept text that was edited is judged by what it says, not by what was kept."""
    import env
    from evals.bench import start_answers
    from trainer.greedy import score_texts

    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path))
    val = [x for x in env.load_split("val-small") if x.size == 3][:4]
    texts = [env.plan_text(x.plan) for x in val[:3]] + ["(0,0)"]
    spec = start_answers.spec({"model.safetensors": "ab" * 32}, "val-small", val, 96, "compact")
    assert start_answers.cached(spec, val) is None  # nothing kept yet
    first = score_texts(val, texts, "mapf")
    assert first["valid"] == [True, True, True, False] and first["valid_rate"] == 0.75
    start_answers.keep(spec, first)
    again = start_answers.cached(spec, val)
    assert {k: again[k] for k in ("valid", "by_level", "failures", "answers")} == \
        {k: first[k] for k in ("valid", "by_level", "failures", "answers")}
    assert start_answers.path(spec).parent == tmp_path / "start_answers" and not list(tmp_path.rglob("*.tmp"))
    for other in ({**spec, "weights": {"model.safetensors": "cd" * 32}}, {**spec, "max_new_tokens": 128},
                  {**spec, "threads": spec["threads"] + 1}, {**spec, "cpu": {"model name": "another CPU"}}):
        assert start_answers.path(other) != start_answers.path(spec) and start_answers.cached(other, val) is None
    assert start_answers.cached(spec, val[:3]) is None  # another instance list under the same spec
    kept = json.loads(start_answers.path(spec).read_text())
    kept["answers"][0]["answer"] = "(0,0)"  # edited on disk: verified again, so it now fails
    start_answers.path(spec).write_text(json.dumps(kept))
    assert start_answers.cached(spec, val)["valid"] == [False, True, True, False]
    start_answers.path(spec).write_text("{ half written")
    assert start_answers.cached(spec, val) is None
    with pytest.raises(ValueError, match="3 answers for 4 instances"):
        score_texts(val, texts[:3], "mapf")


def test_the_cpu_long_preset_is_the_arm_its_figures_were_measured_with():
    """The preset's documented gain (trainer.config) comes from the arm measured in evals/results/learning_cpu, run as `--preset cpu` with the
    values set by hand: `--preset cpu-long`'s settings and default GRPO sizes must be that arm's, so its runs pool
    with the committed seeds. A changed preset value fails here, as it should: the figures would no longer be its."""
    from evals.bench.bench_learning import GRPO_SIZES, same_setup
    from trainer.config import TRAIN_PRESETS, TrainConfig

    measured_path = f"{PACKED}:bench_learning_s57_ws300_grpo96_g8_sizes34_rr0_seed0.json"
    measured = json.loads(read_text(measured_path))
    assert measured["preset"] == "cpu"
    mine = {**measured, "preset": "cpu-long", "grpo_sizes": sorted(int(x) for x in GRPO_SIZES["cpu-long"].split(",")),
            "train_config": TrainConfig.model_validate(TRAIN_PRESETS["cpu-long"]).model_dump(mode="json")}
    same_setup(Path("cpu-long.json"), mine, measured_path, measured)  # raises on any difference
    cpu = {**mine, "train_config": TrainConfig.model_validate(TRAIN_PRESETS["cpu"]).model_dump(mode="json")}
    with pytest.raises(ValueError, match=r"train_config differs .*max_steps: 24 vs 96"):
        same_setup(Path("cpu.json"), cpu, measured_path, measured)


def test_the_cpu_long_headline_pools_again_from_the_packed_files():
    """The 6-seed figure of the 96-step stage, pooled again from its packed per-run files: the same seeds and mean
    gain as its committed pool file, and the two-way interval recomputed from their per-instance answers."""
    names = ["bench_learning_s57_ws300_grpo96_g8_sizes34_rr0.json",
             "bench_learning_s57_ws300_grpo96_g8_sizes34_rr0_seed3.json",
             "bench_learning_s60_ws300_grpo96_g8_sizes34_rr0_seed4.json",
             "bench_learning_s60_ws300_grpo96_g8_sizes34_rr0_seed5.json"]
    s = pool([f"{PACKED}:{n}" for n in names])
    committed = json.loads(read_text(f"{PACKED}:bench_learning_s57_ws300_grpo96_g8_sizes34_rr0_6seeds.json"))
    assert [r["seed"] for r in s["seeds"]] == [r["seed"] for r in committed["seeds"]] == [0, 1, 2, 3, 4, 5]
    assert s["mean_gain"] == pytest.approx(committed["mean_gain"])
    lo, hi = s["gain_interval_bootstrap_95"]
    assert round(100 * s["mean_gain"], 1) == 5.2 and (round(100 * lo, 1), round(100 * hi, 1)) == (-0.4, 10.9)
