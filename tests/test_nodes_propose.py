"""propose_config + validate_config with scripted engineer replies: extraction, the adversarial replies
(each ends accepted / projected / kept with its reason recorded, never a crash), retries with feedback,
and the saved prompt / reply / validation files."""

from __future__ import annotations

import json
import math

import pytest

from env import SIZES, EnvConfig, random_config, uniform_config
from nodes.propose_config import answer_schema, extract_proposal, system_prompt
from nodes.validate_config import check_proposal, config_diff, route_after_validation

try:
    from tests.test_nodes_support import ScriptedChat, engineer_round, make_settings
except ImportError:  # tests/ is not a package: pytest puts it on sys.path
    from test_nodes_support import ScriptedChat, engineer_round, make_settings


def _sizes(data=0.125, hole=0.2, wait=0.4):
    return {str(s): {"data_ratio": data, "hole_ratio": hole, "wait_ratio": wait} for s in SIZES}


GOOD = {"sizes": _sizes()}
GOOD_JSON = json.dumps(GOOD)


def _state(stage=1):
    return {
        "stage": stage,
        "config": random_config(11).model_dump(mode="json"),
        "metrics": {"eval/valid_rate": 0.2, "by_size": {}},
        "context": "# Evidence\nvalid 20%",
        "checkpoint": None,
    }


# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text",
    [
        GOOD_JSON,
        f"Sure, here is my proposal:\n```json\n{GOOD_JSON}\n```\nThis should help.",
        f"I think {{this}} matters. {GOOD_JSON} -- done",
        "```\n" + json.dumps({**GOOD, "rationale": "more holes"}) + "\n```",
        json.dumps(_sizes()),  # a bare size-keyed object
        GOOD_JSON[:-1] + ",}",  # trailing comma
    ],
)
def test_extract_finds_the_config(text):
    ex = extract_proposal(text)
    assert ex.error is None
    assert EnvConfig.model_validate(ex.config).sizes[3].hole_ratio == 0.2


def test_extract_takes_rationale_from_key_or_prose():
    assert extract_proposal(json.dumps({**GOOD, "rationale": "why"})).rationale == "why"
    assert extract_proposal(f"Cut 10x10. {GOOD_JSON}").rationale == "Cut 10x10."


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("I would raise the holes a bit.", "no JSON object"),
        (GOOD_JSON[: len(GOOD_JSON) // 2], "does not decode"),
        ('{"answer": 42}', "no 'sizes'"),
    ],
)
def test_extract_says_why_nothing_was_found(text, words):
    ex = extract_proposal(text)
    assert ex.config is None and words in ex.error


def test_extract_is_bounded_on_a_100kb_reply():
    import time

    text = ("{ not json " * 12000)[:100_000]
    t0 = time.monotonic()
    ex = extract_proposal(text)
    assert ex.config is None and time.monotonic() - t0 < 5


def test_system_prompt_carries_the_schema_and_contract():
    sp = system_prompt()
    assert '"sizes"' in sp and "{schema}" not in sp and "rationale" in sp
    assert json.dumps(EnvConfig.engineer_schema(), indent=1) in sp
    assert "rationale" in answer_schema()["properties"]


# ----------------------------------------------------------------------------- validation steps


def test_check_proposal_accepts_projects_or_rejects():
    cur = uniform_config().model_dump(mode="json")
    assert check_proposal(GOOD, cur)["decision"] == "accepted"
    out = check_proposal({"sizes": _sizes(data=5)}, cur)
    assert out["decision"] == "projected" and out["errors"] and any("renormalised" in n for n in out["notes"])
    out = check_proposal({**GOOD, "num_agents": 5, "reward": "max"}, cur)
    assert out["decision"] == "accepted" and out["config"].num_agents == 2  # run-level keys are not the engineer's
    assert any("num_agents" in n for n in out["notes"])
    out = check_proposal({"sizes": [1, 2, 3]}, cur)
    assert out["config"] is None and out["errors"]


def test_diff_lists_moved_knobs_only():
    a = uniform_config().model_dump(mode="json")
    b = json.loads(json.dumps(a))
    b["sizes"]["5"]["hole_ratio"] = 0.3
    assert config_diff(a, b) == {"5": {"hole_ratio": {"from": 0.2, "to": 0.3}}}


# ----------------------------------------------------------------------------- adversarial replies


def _huge_reply() -> str:
    junk = "The policy fails a lot. " * 4000  # ~100 KB of prose, then a usable object at the end
    return junk + GOOD_JSON


ADVERSARIAL = {
    "no_json": ("I cannot decide. Maybe more holes?", {"kept_previous"}),
    "truncated": (GOOD_JSON[:150], {"kept_previous"}),
    "prose_and_fence": (f"Reasoning...\n```json\n{GOOD_JSON}\n```\nThanks", {"accepted"}),
    "missing_sizes": (json.dumps({"sizes": {"3": _sizes()["3"], "4": _sizes()["4"]}}), {"projected"}),
    "no_sizes_key": (json.dumps({"data": 1, "holes": 2}), {"kept_previous"}),
    "extra_keys": (json.dumps({**GOOD, "num_agents": 5, "temperature": 9, "rationale": "x"}), {"accepted"}),
    "extra_knob": (json.dumps({"sizes": {**_sizes(), "3": {**_sizes()["3"], "speed": 3}}}), {"projected"}),
    "nan": (GOOD_JSON.replace('"hole_ratio": 0.2', '"hole_ratio": NaN', 1), {"projected"}),
    "negative": (json.dumps({"sizes": _sizes(hole=-0.5)}), {"projected"}),
    "huge": (json.dumps({"sizes": _sizes(data=1e300, wait=1e9)}), {"projected"}),
    "strings": (json.dumps({"sizes": _sizes(data="0.125", hole="lots")}), {"projected"}),
    "sum_zero": (json.dumps({"sizes": _sizes(data=0)}), {"projected"}),
    "sum_forty": (json.dumps({"sizes": _sizes(data=5)}), {"projected"}),
    "sizes_not_object": (json.dumps({"sizes": "all of them"}), {"kept_previous"}),
    "size_not_object": (json.dumps({"sizes": {**_sizes(), "3": 0.5}}), {"kept_previous"}),
    "reply_100kb": (_huge_reply(), {"accepted"}),
    "empty": ("", {"kept_previous"}),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_reply_ends_in_a_recorded_decision(name, tmp_path):
    text, expected = ADVERSARIAL[name]
    settings = make_settings(engineer="base", engineer_max_attempts=2)
    model = ScriptedChat([text])
    state = _state()
    out = engineer_round(state, settings, tmp_path, model=model)
    assert out["decision"] in expected, (out["decision"], out["feedback"])
    assert route_after_validation(out) == "apply"
    cfg = EnvConfig.model_validate(out["accepted"])  # whatever happened, the next stage gets a legal config
    for k in cfg.sizes.values():
        assert all(math.isfinite(x) and 0 <= x <= 1 for x in (k.data_ratio, k.hole_ratio, k.wait_ratio))
    doc = json.loads((tmp_path / "stage_1" / "validation.json").read_text())  # strict JSON, no NaN
    assert doc["final"] == out["decision"]
    assert all(d["reason"] and d["decision"] for d in doc["decisions"])
    if out["decision"] == "kept_previous":
        assert len(doc["decisions"]) == 2 and doc["decisions"][0]["decision"] == "retry"
        assert doc["decisions"][-1]["errors"] and out["accepted"] == EnvConfig.model_validate(state["config"]).model_dump(mode="json")
        # the second attempt was told why the first failed
        assert "could not be used" in model.calls[1][0][-1]["content"]
    else:
        assert len(doc["decisions"]) == 1 and len(model.calls) == 1
    if out["decision"] == "projected":
        assert doc["decisions"][-1]["notes"]


def test_retry_then_accept_records_every_attempt(tmp_path):
    settings = make_settings(engineer="openai")
    model = ScriptedChat(["no idea", f"ok: {json.dumps({**GOOD, 'rationale': 'uniform, moderate'})}"])
    out = engineer_round(_state(), settings, tmp_path, model=model)
    assert out["decision"] == "accepted" and out["attempts"] == 2 and out["rationale"] == "uniform, moderate"
    sdir = tmp_path / "stage_1"
    doc = json.loads((sdir / "validation.json").read_text())
    assert [d["decision"] for d in doc["decisions"]] == ["retry", "accepted"]
    assert doc["decisions"][1]["diff"]  # moved from the random config to the uniform one
    prompt, reply = (sdir / "engineer_prompt.md").read_text(), (sdir / "engineer_reply.md").read_text()
    assert "# attempt 1" in prompt and "# attempt 2" in prompt and "no JSON object" in prompt
    assert "# attempt 1" in reply and "no idea" in reply and "# attempt 2" in reply
    # the exact messages sent are the ones saved
    assert model.calls[0][0][0]["content"] in prompt and model.calls[1][0][1]["content"] in prompt
    assert model.calls[0][1]["json_schema"] == answer_schema()


def test_classic_engineer_goes_through_the_same_node(tmp_path):
    settings = make_settings(engineer="threshold")
    state = _state()
    state["config"] = uniform_config().model_dump(mode="json")
    state["metrics"]["by_size"] = {"3": {"n": 10, "valid_rate": 0.9, "optimal_rate": 0.5}}
    out = engineer_round(state, settings, tmp_path)
    assert out["decision"] == "accepted"
    assert out["accepted"]["sizes"]["3"]["hole_ratio"] > state["config"]["sizes"]["3"]["hole_ratio"]
    assert out["engineer_memory"]["levels"] == {"3": 1}
    assert (tmp_path / "stage_1" / "engineer_reply.md").read_text().count("threshold") >= 1
