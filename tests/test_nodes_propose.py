"""propose_config + validate_config with scripted engineer replies: extraction, the adversarial replies
(each ends accepted / projected / kept with its reason recorded, never a crash), retries with feedback,
and the saved prompt / reply / validation files."""

from __future__ import annotations

import json
import math
import re

import pytest

from env import SIZES, EnvConfig, random_config, uniform_config
from families.mapf import MapfFamily, answer_schema, check, config_diff, system_prompt
from families.reply import MAX_REPLY_CHARS, read_reply
from graph.graph import route_after_validation
from nodes.validate_config import MAX_STORED_CHARS, MAX_STORED_DEPTH, validate_config
from tests.support.node_helpers import ScriptedChat, engineer_round, make_settings, runtime


def extract_proposal(text, finish_reason=None, parsed=None):
    return read_reply(text, MapfFamily.shape, finish_reason, parsed)


def check_proposal(proposal, current, repair=True):
    """MAPF's one check, as a last attempt or a person's edit runs it (projection allowed)."""
    return check(proposal, current, feasibility_n=4, seed=0, repair=repair)


def _sizes(data=0.125, hole=0.2, wait=0.4):
    return {str(s): {"data_ratio": data, "hole_ratio": hole, "wait_ratio": wait} for s in SIZES}


GOOD = {"sizes": _sizes()}
GOOD_JSON = json.dumps(GOOD)


def _state(stage=1):
    return {
        "stage": stage,
        "config": random_config(11).model_dump(mode="json"),
        "metrics": {"eval/valid_rate": 0.2, "by_level": {}},
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


def test_extract_is_bounded_on_a_100kb_reply(monkeypatch):
    """12,000 '{' that never decode: the work is bounded by count (decode starts, balanced scans), not by a clock."""
    from families import reply as pc

    calls = {"decode": 0, "scan": 0}

    class CountingDecoder:
        def raw_decode(self, text, i):
            calls["decode"] += 1
            return json.JSONDecoder().raw_decode(text, i)

    real_scan = pc._balanced_end

    def counting_scan(*a, **k):
        calls["scan"] += 1
        return real_scan(*a, **k)

    monkeypatch.setattr(pc, "_DECODER", CountingDecoder())
    monkeypatch.setattr(pc, "_balanced_end", counting_scan)
    text = ("{ not json " * 12000)[:100_000]
    assert text.count("{") > 10 * pc.MAX_DECODE_STARTS
    ex = extract_proposal(text)
    assert ex.config is None and "does not decode" in ex.error
    assert calls == {"decode": pc.MAX_DECODE_STARTS, "scan": min(pc.MAX_BALANCED_SCANS, pc.MAX_DECODE_STARTS)}


# '{"a":' repeated: ~100 KB of JSON nested far deeper than the decoder's recursion limit
DEEP_100KB = '{"a":' * 20_000
# a balanced list nested 50,000 deep where the sizes belong
DEEP_SIZES = '{"sizes": ' + "[" * 50_000 + "]" * 50_000 + "}"
# a valid config with an extra key nested 900 deep: it decodes, so validation.json must store it safely
DEEP_EXTRA = json.dumps(GOOD)[:-1] + ', "extra": ' + "[" * 900 + "]" * 900 + "}"
HUGE_INT = json.dumps(GOOD).replace('"data_ratio": 0.125', '"data_ratio": 1' + "0" * 399, 1)


@pytest.mark.parametrize("text", [DEEP_100KB, DEEP_SIZES, "```json\n" + '{"sizes": ' + "[" * 30_000 + "\n```"])
def test_extract_survives_deep_nesting(text):
    ex = extract_proposal(text)  # a RecursionError inside the decoder must not escape
    assert ex.config is None and "does not decode" in ex.error


def test_extract_reads_only_the_first_max_reply_chars():
    ex = extract_proposal("x" * MAX_REPLY_CHARS + json.dumps(GOOD))  # the config lies past the cap
    assert ex.config is None and f"only the first {MAX_REPLY_CHARS}" in ex.error and ex.notes
    ex = extract_proposal(json.dumps(GOOD) + "x" * MAX_REPLY_CHARS)  # inside the cap: found, cut noted
    assert ex.config == GOOD and any("cut" in n for n in ex.notes)


def test_system_prompt_carries_the_contract_once_compactly_with_no_number_to_copy():
    sp = system_prompt()
    assert '"sizes"' in sp and "{schema}" not in sp and "rationale" in sp
    assert '"data_ratio": <share>' in sp and '"properties"' not in sp  # the shape, not the pretty-printed schema
    # no config value a model could copy: the knobs' numbers come from the evidence only
    assert not re.search(r"\b0\.\d+\b", sp), re.findall(r"\b0\.\d+\b", sp)
    # "optimal" is explained by the run's criterion (train.optimality), never left as a placeholder
    assert "optimal when its makespan" in sp and "{optimal_means}" not in sp
    assert "optimal when its sum of costs" in system_prompt(optimality="soc")
    with pytest.raises(ValueError, match="optimality 'fastest': allowed: makespan, soc"):
        system_prompt(optimality="fastest")
    assert "rationale" in answer_schema()["properties"]


# ----------------------------------------------------------------------------- validation steps


def test_check_proposal_accepts_projects_or_rejects():
    cur = uniform_config().model_dump(mode="json")
    assert check_proposal(GOOD, cur).how == "accepted"
    out = check_proposal({"sizes": _sizes(data=5)}, cur)
    assert out.how == "projected" and out.errors and any("renormalised" in n for n in out.notes)
    out = check_proposal({**GOOD, "num_agents": 5, "reward": "max"}, cur)
    assert out.how == "accepted" and out.config["num_agents"] == 2  # run-level keys are not the engineer's
    assert any("num_agents" in n for n in out.notes)
    out = check_proposal({"sizes": [1, 2, 3]}, cur)
    assert out.config is None and out.errors


def test_numeric_strings_fail_strict_validation_and_are_projected_with_a_note():
    cur = uniform_config().model_dump(mode="json")
    out = check_proposal({"sizes": _sizes(data="0.125")}, cur)
    assert out.how == "projected"  # not "accepted": strict validation takes numbers only
    assert "sizes.3.data_ratio" in out.errors[0] and "not a string" in out.errors[0]
    assert "sizes.3.data_ratio: read the string '0.125' as the number 0.125" in out.notes
    assert out.config["sizes"] == EnvConfig.model_validate(GOOD).model_dump(mode="json")["sizes"]  # the same numbers, once converted
    # integers are still numbers: {"data_ratio": 0} is strictly valid
    ints = _sizes()
    ints["3"], ints["4"] = {**ints["3"], "data_ratio": 0}, {**ints["4"], "data_ratio": 0.25}
    assert check_proposal({"sizes": ints}, cur).how == "accepted"


def test_integer_too_large_for_a_float_is_clipped_with_a_note():
    cur = uniform_config().model_dump(mode="json")
    sizes = _sizes()
    sizes["3"] = {**sizes["3"], "data_ratio": 10**400}
    sizes["4"] = {**sizes["4"], "hole_ratio": -(10**400)}
    out = check_proposal({"sizes": sizes}, cur)  # float(10**400) raises OverflowError
    assert out.how == "projected"
    assert "sizes.3.data_ratio" in out.errors[0] and "401 digits" in out.errors[0]
    assert "sizes.3.data_ratio: clipped an integer of about 401 digits to 1" in out.notes
    assert "sizes.4.hole_ratio: clipped an integer of about 401 digits to 0" in out.notes
    cfg = out.config
    assert cfg["sizes"]["4"]["hole_ratio"] == 0.0 and cfg["sizes"]["3"]["data_ratio"] == pytest.approx(1 / 1.875)


def test_check_proposal_records_any_error_as_a_reason():
    cur = uniform_config().model_dump(mode="json")
    deep: list = []
    for _ in range(5000):  # deeper than any recursive check could follow
        deep = [deep]
    out = check_proposal({"sizes": {**_sizes(), "3": deep}}, cur)
    assert out.config is None and len(out.errors) == 2 and "cannot project" in out.errors[1]


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
    "huge_int": (HUGE_INT, {"projected"}),  # a 400-digit integer: float() overflows
    "numeric_strings": (json.dumps({"sizes": _sizes(data="0.125")}), {"projected"}),
    "deep_100kb": (DEEP_100KB, {"kept_previous"}),  # the decoder's RecursionError
    "deep_sizes": (DEEP_SIZES, {"kept_previous"}),
    "deep_extra": (DEEP_EXTRA, {"accepted"}),  # a valid config; the nested extra key is dropped
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
        assert "could not be used" in model.calls[-1][0][-1]["content"]
    elif out["decision"] == "projected":  # outside the legal space: sent back first, projected on the last attempt
        assert [d["decision"] for d in doc["decisions"]] == ["retry", "projected"] and len(model.calls) == 2
        assert doc["decisions"][-1]["notes"] and "could not be used" in model.calls[1][0][-1]["content"]
    else:
        assert len(doc["decisions"]) == 1 and len(model.calls) == 1


@pytest.mark.parametrize("data, total", [({3: 0.333, 4: 0.333, 5: 0.333}, "0.999"),
                                         ({3: 20, 4: 30, 5: 50}, "100 (percentages)")])
def test_shares_off_only_by_rounding_are_normalised_at_once_and_recorded_so(data, total, tmp_path):
    """One repair policy for every family: data ratios summing to 0.999, or percentages summing to 100, are rescaled
    at the first attempt ("normalised", never sent back); the same proposal outside the legal space is sent back."""
    sizes = {str(s): {"data_ratio": data.get(s, 0.0), "hole_ratio": 0.1, "wait_ratio": 0.25} for s in SIZES}
    settings = make_settings(engineer="base", engineer_max_attempts=3)
    model = ScriptedChat([json.dumps({"sizes": sizes})])
    out = engineer_round(_state(), settings, tmp_path, model=model)
    doc = json.loads((tmp_path / "stage_1" / "validation.json").read_text())
    assert out["decision"] == doc["final"] == "normalised" and len(model.calls) == 1
    record = doc["decisions"][-1]
    assert record["notes"] == [f"sizes.*.data_ratio: shares summed to {total}; normalised to sum to 1"]
    assert "normalised" in record["reason"] and "data_ratio" in record["errors"][0]
    shares = {s: out["accepted"]["sizes"][str(s)]["data_ratio"] for s in data}
    assert shares == pytest.approx({s: v / sum(data.values()) for s, v in data.items()})
    assert check_proposal({"sizes": {**sizes, "3": {**sizes["3"], "data_ratio": 2}}}, _state()["config"],
                          repair=False).config is None  # not rounding: outside the legal space


def test_validation_json_stores_a_deep_or_huge_proposal_safely(tmp_path):
    deep: list = []
    for _ in range(5000):  # a Python-level recursion over this would raise RecursionError
        deep = [deep]
    settings = make_settings(engineer="base")
    state = {**_state(), "proposal": {**GOOD, "extra": deep}, "attempts": 1, "rationale": "r"}
    out = validate_config(state, runtime(settings, tmp_path))
    assert out["decision"] == "accepted"
    doc = json.loads((tmp_path / "stage_1" / "validation.json").read_text())
    stored = doc["decisions"][-1]["proposal"]
    assert stored["sizes"] == GOOD["sizes"]  # the config part is kept as JSON
    level = stored["extra"]
    for _ in range(MAX_STORED_DEPTH - 1):
        level = level[0]
    assert level == f"[list nested deeper than {MAX_STORED_DEPTH} levels: not stored]"
    assert any("extra: dropped" in n for n in doc["decisions"][-1]["notes"])

    big = {**GOOD, "notes": ["padding " * 100] * 100}  # ~80 KB of JSON
    state = {**_state(), "proposal": big, "attempts": 1, "rationale": "r"}
    validate_config(state, runtime(settings, tmp_path / "big"))
    stored = json.loads((tmp_path / "big" / "stage_1" / "validation.json").read_text())["decisions"][-1]["proposal"]
    assert isinstance(stored, str) and stored.startswith('{"sizes"') and "more characters cut" in stored
    assert len(stored) < MAX_STORED_CHARS + 100


def test_feasibility_shortfall_rejects_the_proposal(tmp_path, monkeypatch):
    """The shortfall branch of the dry-run. The real generator serves every legal config (it falls back to
    a draw with the other wait value, and no legal hole ratio leaves too little room), so no config can
    produce a shortfall for real: a test double wraps the real generator and drops instances, as a
    generator that gives up on a size would."""
    import env as real_env

    def short(cfg, n, seed, **kw):
        gen = real_env.generate(cfg, n, seed, **kw)
        keep = [i for i in gen.instances if i.size == 4][:4]  # none of size 3, half of size 4
        stats = json.loads(json.dumps(gen.stats))
        stats["produced"] = len(keep)
        stats["sizes"]["3"]["produced"], stats["sizes"]["4"]["produced"] = 0, 4
        return real_env.Generated(instances=keep, stats=stats)

    monkeypatch.setattr("families.mapf.generate", short)
    sizes = {str(s): {"data_ratio": 0.5 if s in (3, 4) else 0.0, "hole_ratio": 0.1, "wait_ratio": 0.5} for s in SIZES}
    settings = make_settings(engineer="base", engineer_max_attempts=1, feasibility_n=16)
    state = {**_state(), "proposal": {"sizes": sizes}, "attempts": 1, "rationale": "only small maps"}
    out = validate_config(state, runtime(settings, tmp_path))
    assert out["decision"] == "kept_previous"
    doc = json.loads((tmp_path / "stage_1" / "validation.json").read_text())
    feas = doc["decisions"][-1]["feasibility"]
    assert feas["ok"] is False and feas["asked"] == 16 and feas["produced"] == 4
    # overall 4 < 16/2, size 3: 0 < 8/2; size 4 got exactly half (4 of 8), which is not a shortfall
    assert feas["problems"] == [
        "the generator served only 4 of 16 instances",
        "size 3: the generator served 0 of 8 asked instances",
    ]
    assert [f"infeasible: {p}" for p in feas["problems"]] == doc["decisions"][-1]["errors"]


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
    # the request parameters are recorded beside the messages; an API engineer's limit is its backend's (a
    # reasoning model's), not the self engineer's engineer_max_tokens
    assert "Request: max_tokens=16384, temperature=0.0, json_schema=yes" in prompt


def test_prompt_file_records_an_unstructured_request(tmp_path):
    settings = make_settings(engineer="openai", engineer_structured=False, engineer_temperature=0.7)
    model = ScriptedChat([GOOD_JSON])
    engineer_round(_state(), settings, tmp_path, model=model)
    prompt = (tmp_path / "stage_1" / "engineer_prompt.md").read_text()
    assert "Request: max_tokens=16384, temperature=0.7, json_schema=no" in prompt
    assert model.calls[0][1]["json_schema"] is None and model.calls[0][1]["temperature"] == 0.7


def test_classic_engineer_goes_through_the_same_node(tmp_path):
    settings = make_settings(engineer="threshold")
    state = _state()
    state["config"] = uniform_config().model_dump(mode="json")
    state["metrics"]["by_level"] = {"3": {"n": 10, "valid_rate": 0.9, "optimal_rate": 0.5}}
    out = engineer_round(state, settings, tmp_path)
    assert out["decision"] == "accepted"
    assert out["accepted"]["sizes"]["3"]["hole_ratio"] > state["config"]["sizes"]["3"]["hole_ratio"]
    assert out["engineer_memory"]["levels"] == {"3": 1}
    assert (tmp_path / "stage_1" / "engineer_reply.md").read_text().count("threshold") >= 1


def test_extract_takes_the_backends_parsed_json_without_parsing_the_text_again():
    parsed = {"sizes": {"4": {}}, "rationale": "why"}  # differs from the text on purpose: the text is not read
    e = extract_proposal('prose {"sizes": {"3": {}}} more', parsed=parsed)
    assert e.config == {"sizes": {"4": {}}} and e.rationale == "why"
    assert extract_proposal('Because. {"sizes": {}}', parsed={"sizes": {}}).rationale == "Because."
