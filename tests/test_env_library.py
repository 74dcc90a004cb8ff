"""The testbed as a library: dataset rows and a Hugging Face Dataset, reasoning-gym-style
create_dataset / score_answer, the public TRL-signature reward, `verify` reporting unanswered instances,
`export` carrying the prompt, and `show --png --steps` drawing the steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from env import (
    LengthAwareReward,
    RewardState,
    accuracy_reward,
    create_dataset,
    load_split,
    mapf_reward,
    plan_text,
    render_compact_prompt,
    render_prompt,
    score_answer,
    score_answers,
    to_dataset,
    total_reward,
    verify,
)
from env.library import instance_of, row

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def insts():
    return load_split("val-mini")[:6]


def _detour(inst):
    """One agent waits once at its start: valid but one step over the optimum (the first agent for which the
    delay causes no conflict)."""
    for k in range(inst.num_agents):
        plan = [list(p) for p in inst.plan]
        plan[k] = [plan[k][0], *plan[k]]
        v = verify(inst, plan_text(plan))
        if v.valid and not v.optimal:
            return plan
    raise AssertionError(f"no single wait keeps {inst.id} valid")


# -------------------------------------------------------------------------------- rows and Dataset


def test_row_carries_prompt_answer_instance_and_metadata(insts):
    inst = insts[0]
    r = row(inst)
    assert r["prompt"] == [{"role": "user", "content": render_prompt(inst)}]
    assert r["answer"] == plan_text(inst.plan)
    assert verify(inst, r["answer"]).optimal  # the answer column is the optimal plan, in the answer format
    assert instance_of(r["instance"]) == inst
    assert r["metadata"]["size"] == inst.size and r["metadata"]["optimal_cost"] == inst.optimal_cost
    compact = row(inst, "compact")["prompt"]
    assert compact == [{"role": "system", "content": ""}, {"role": "user", "content": render_compact_prompt(inst)}]
    with pytest.raises(ValueError, match="prompt style 'tiny': allowed: full, compact, moves"):
        row(inst, "tiny")


def test_to_dataset_is_a_hf_dataset_with_the_columns(insts):
    from datasets import Dataset

    ds = to_dataset(insts)
    assert isinstance(ds, Dataset) and len(ds) == len(insts)
    assert set(ds.column_names) == {"prompt", "answer", "instance", "instance_id", "metadata"}
    assert ds[2]["instance_id"] == insts[2].id and ds[2]["prompt"][0]["content"] == render_prompt(insts[2])
    # mixed splits (tags differ between val and test instances) still make one typed column
    mixed = to_dataset([*insts[:2], *load_split("test-mini")[:2]])
    assert json.loads(mixed[3]["metadata"]["tags"])["agents"] >= 3
    with pytest.raises(ValueError, match="no instances"):
        to_dataset([])


# -------------------------------------------------------------------------------- reasoning-gym style


def test_create_dataset_is_deterministic_and_scores_like_the_verifier():
    a = create_dataset("random", n=4, seed=3)
    assert a == create_dataset("random", n=4, seed=3)  # same (config, n, seed), same entries
    assert a != create_dataset("random", n=4, seed=4)
    assert len(a) == 4 and set(a[0]) == {"question", "answer", "metadata"}
    e = a[0]
    inst = instance_of(e)
    assert e["question"] == render_prompt(inst)
    assert score_answer(e["answer"], e) == 1.0
    assert score_answer(None, e) == 0.0
    assert score_answer("I give up", e) == 0.0  # no <answer> block: parse_error
    detour = plan_text(_detour(inst))
    assert 0.3 <= score_answer(detour, e) < 1.0
    assert score_answer(detour, e) == accuracy_reward(verify(inst, detour))


def test_create_dataset_bad_config_one_clear_error():
    with pytest.raises(ValueError, match=r"config 'hard': allowed: an EnvConfig, a dict of its fields, or 'random'"):
        create_dataset("hard", 2, 0)
    with pytest.raises(ValueError, match="n must be an integer >= 0, got -1"):
        create_dataset("random", -1, 0)
    with pytest.raises(ValueError, match="config: .*sizes"):
        create_dataset({"sizes": {3: {"data_ratio": 1.0, "hole_ratio": 2.0, "wait_ratio": 0.0}}}, 2, 0)


# -------------------------------------------------------------------------------- the public reward


def test_public_reward_scores_right_and_wrong_exactly_as_verifier_and_reward(insts):
    inst = insts[1]
    right = plan_text(inst.plan)
    detour = plan_text(_detour(inst))
    swapped = plan_text([inst.plan[1], inst.plan[0]])  # each agent starts on the other's start: wrong_start
    wrong = "<answer>\nAgent 0: (0,0)\n</answer>"  # one agent missing: agent_count
    comps = [right, detour, swapped, wrong]
    got = mapf_reward(comps, instance=[inst.to_json()] * 4, prompts=[None] * 4)
    want = [accuracy_reward(verify(inst, c)) for c in comps]
    assert got == want
    assert got[0] == 1.0 and 0.3 <= got[1] < 1.0 and got[2] == 0.0 and got[3] == 0.0
    assert verify(inst, swapped).failure == "wrong_start" and verify(inst, wrong).failure == "agent_count"
    # TRL's conversational completions (a list of messages) score the same
    conv = [[{"role": "assistant", "content": c}] for c in comps]
    assert mapf_reward(conv, instance=[inst.to_json()] * 4) == want


def test_public_reward_scores_each_row_against_its_own_instance(insts):
    a, b = insts[0], insts[3]
    # b's optimal plan is right for b and wrong for a: the reward must read the row's instance, not a position
    assert mapf_reward([plan_text(b.plan), plan_text(b.plan)], instance=[a.to_json(), b.to_json()]) == [
        accuracy_reward(verify(a, plan_text(b.plan))), 1.0]
    with pytest.raises(ValueError, match="needs the dataset column 'instance'"):
        mapf_reward(["x"])
    with pytest.raises(ValueError, match="2 completions but 1 instances"):
        mapf_reward(["x", "y"], instance=[a.to_json()])


def test_length_aware_reward_is_total_reward_with_one_state_update_per_batch(insts):
    inst = insts[0]
    right = plan_text(inst.plan)
    r = LengthAwareReward()
    ids = [[0] * 100, [0] * 2798]
    got = r([right, right], instance=[inst.to_json()] * 2, completion_ids=ids)
    v = verify(inst, right)
    assert got == [total_reward(v, 100, RewardState()), total_reward(v, 2798, RewardState())]
    assert r.state.updates == 1 and r.state.short_share == RewardState().update([100, 2798]).short_share


def test_length_aware_reward_equals_the_projects_training_reward(insts):
    from env.task import MapfReward

    comps = [plan_text(i.plan) for i in insts[:3]] + ["no idea", plan_text(_detour(insts[0]))]
    raws = [i.to_json() for i in insts[:3]] + [insts[3].to_json(), insts[0].to_json()]
    ids = [[0] * n for n in (50, 1600, 3000, 10, 5000)]
    ours, theirs = LengthAwareReward(), MapfReward()
    for _ in range(3):  # the adaptive weights move the same way batch after batch
        assert ours(comps, instance=raws, completion_ids=ids) == theirs(completions=comps, instance=raws,
                                                                        completion_ids=ids)
        assert ours.state == theirs.state


def test_importing_the_public_reward_does_not_import_torch():
    code = ("import sys; from env.library import mapf_reward, create_dataset, score_answer; "
            "import env; print('torch' in sys.modules, 'transformers' in sys.modules, 'trl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"], out.stdout + out.stderr


def test_grpo_trainer_takes_the_public_dataset_and_reward(insts, embedded_model_path, tmp_path):
    """Trains nothing: a TRL GRPOTrainer built from the public API alone accepts its dataset and reward, and the
    reward it holds scores the dataset's own answers as the verifier does. The model is a folder, as a user's
    would be: a two-block random Llama with the embedded model's tokenizer (what it computes is not looked at)."""
    from trl import GRPOConfig, GRPOTrainer

    from tests.support.tiny_llama import save_tiny_llama

    save_tiny_llama(tmp_path / "tiny", embedded_model_path)
    ds = to_dataset(insts)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, num_generations=2,
                      per_device_train_batch_size=2, max_completion_length=16, max_steps=1, report_to="none",
                      save_strategy="no")
    trainer = GRPOTrainer(model=str(tmp_path / "tiny"), reward_funcs=mapf_reward, args=args, train_dataset=ds)
    assert trainer.reward_funcs == [mapf_reward]
    assert trainer.train_dataset.column_names == ds.column_names
    batch = trainer.train_dataset[:3]
    # what TRL passes: completions plus every column as a keyword
    got = trainer.reward_funcs[0](completions=[[{"role": "assistant", "content": a}] for a in batch["answer"]],
                                  prompts=batch["prompt"], **{k: v for k, v in batch.items() if k != "prompt"})
    assert got == [1.0, 1.0, 1.0]


# -------------------------------------------------------------------------------- CLI: verify, export, show


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_verify_reports_unanswered_instances(insts, tmp_path, capsys):
    from env.__main__ import main

    inst_file = _write(tmp_path / "i.jsonl", [json.loads(i.to_json()) for i in insts])
    ans = _write(tmp_path / "a.jsonl", [{"id": insts[0].id, "text": plan_text(insts[0].plan)},
                                        {"id": insts[1].id, "text": "no idea"}])
    assert main(["verify", "--instances", str(inst_file), "--answers", str(ans), "--out", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "2 answers: valid 0.500" in out
    line = next(x for x in out.splitlines() if x.startswith("unanswered:"))
    assert f"4 of {len(insts)} instances have no answer" in line
    assert f"valid {1 / len(insts):.3f}" in line and insts[2].id in line
    # the library function says the same
    s = score_answers(insts, {insts[0].id: plan_text(insts[0].plan), insts[1].id: "no idea"})
    assert s["unanswered"] == 4 and s["unanswered_ids"] == [i.id for i in insts[2:]]
    assert s["valid_rate"] == 0.5 and s["valid_rate_all"] == pytest.approx(1 / len(insts))
    everything = _write(tmp_path / "all.jsonl", [{"id": i.id, "text": plan_text(i.plan)} for i in insts])
    assert main(["verify", "--instances", str(inst_file), "--answers", str(everything), "--out", str(tmp_path / "v")]) == 0
    assert f"unanswered: 0 of {len(insts)} instances" in capsys.readouterr().out


def test_export_rows_carry_the_prompt_and_load_as_a_dataset(tmp_path, capsys):
    from datasets import load_dataset

    from env.__main__ import main

    out = tmp_path / "rows.jsonl"
    assert main(["export", "--split", "val-mini", "--style", "compact", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    insts = load_split("val-mini")
    assert len(rows) == len(insts)
    assert rows[0]["prompt"][-1]["content"] == render_compact_prompt(insts[0])
    assert score_answer(rows[0]["answer"], rows[0]) == 1.0
    ds = load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert mapf_reward(ds["answer"][:3], instance=ds["instance"][:3]) == [1.0, 1.0, 1.0]
    # the exported rows are also an instances file for verify and show
    ans = _write(tmp_path / "a.jsonl", [{"id": r["instance_id"], "text": r["answer"]} for r in rows])
    assert main(["verify", "--instances", str(out), "--answers", str(ans), "--out", str(tmp_path / "v")]) == 0
    assert f"{len(rows)} answers: valid 1.000, optimal (soc) 1.000" in capsys.readouterr().out
    capsys.readouterr()
    assert main(["export", "--split", "val-mini", "--style", "tiny", "--out", str(tmp_path / "x")]) == 2
    assert "--style 'tiny': allowed: full, compact, moves" in capsys.readouterr().err
    assert main(["export", "--out", str(tmp_path / "x")]) == 2
    assert "exactly one of --split" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_show_png_steps_draws_one_panel_per_step(tmp_path, capsys):
    import matplotlib.image as mpimg

    from env.__main__ import main
    from env.show import plan_figure

    inst = next(i for i in load_split("val-mini") if i.makespan >= 3)
    plain, steps = tmp_path / "plain.png", tmp_path / "steps.png"
    assert main(["show", "--split", "val-mini", "--id", inst.id, "--png", str(plain)]) == 0
    assert main(["show", "--split", "val-mini", "--id", inst.id, "--png", str(steps), "--steps"]) == 0
    capsys.readouterr()
    a, b = mpimg.imread(plain), mpimg.imread(steps)
    assert b.shape[1] > 1.5 * a.shape[1]  # several panels side by side, not the single plan picture
    assert len(plan_figure(inst).axes) == 1
    fig = plan_figure(inst, steps=True)
    assert [ax.get_title() for ax in fig.axes] == [f"step {t}" for t in range(inst.makespan + 1)]


def test_library_doctests():
    import doctest

    import env.library

    result = doctest.testmod(env.library)
    assert result.failed == 0 and result.attempted >= 4
