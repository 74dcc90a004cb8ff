"""The engineer's prompt of each family, pinned (tests/golden/prompts/, re-recorded by
`python -m tests.support.golden_prompts --record`), and what a researcher needs to find in it."""

from __future__ import annotations

import re

import pytest

from tests.support.golden_prompts import FAMILIES, GOLDEN_DIR, render, situation

MAPF_WORDS = ("grid", "agent", "hole", "wait", "puzzle", "map\\b", "size", "frozen", "makespan")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_rendered_prompt_matches_its_golden_file(name):
    want = (GOLDEN_DIR / f"{name}.md").read_text()
    assert render(name) == want, f"re-record with: python -m tests.support.golden_prompts --record ({name})"


@pytest.mark.parametrize("name", FAMILIES)
def test_the_prompt_shows_what_a_researcher_reads(name):
    text = (GOLDEN_DIR / f"{name}.md").read_text()
    system, user = text.split("\n# user\n", 1)
    # rates per level with their 95 % interval
    assert "valid [95% CI]" in user and re.search(r"\d+\.\d% \[\d+-\d+\]", user)
    # the config being edited, and what the last change did (stage 0 -> 1)
    assert "## C. The config you are editing" in user and "(stage 0 -> 1)" in user
    # the budget: stages left, questions per evaluation and what a rate is worth, training per stage
    assert "1 left, this one included" in user and "held-out" in user and "points (95 %)" in user
    assert "Each stage" in user
    # the training signal per level
    assert "training reward" in user and "sampled valid on its training set" in user
    assert ("verified answers kept" if name == "rg" else "groups with no reward spread") in user
    # failing examples with the question, the correct answer and the policy's (fenced) answer
    assert "Question:" in user and "Correct answer:" in user and "UNTRUSTED POLICY ANSWER" in user
    if name == "mapf":
        assert "start/goal of agent 0" in user  # the example's map
    # the answer's shape once, compactly, and no number a model could copy
    assert system.count('"rationale"') == 1 and '"properties"' not in system
    assert not re.search(r"\b0\.\d+\b", system), re.findall(r"\b0\.\d+\b", system)


def test_a_level_share_prompt_has_no_mapf_word():
    for name in ("rg", "toy"):
        text = (GOLDEN_DIR / f"{name}.md").read_text().lower()
        assert not [w for w in MAPF_WORDS if re.search(rf"\b{w}", text)], name


@pytest.mark.parametrize("name", ["toy", "rg"])
def test_context_variants_apply_to_level_share_families(name):
    fam, settings, state, rows = situation(name)
    heads = {}
    for v in ("V1", "V3", "V5", "V6"):
        ctx = fam.context(state, settings.model_copy(update={"context": v}), rows, None)
        heads[v] = set(re.findall(r"^## ([A-Z])\.", ctx, flags=re.M))
        assert f"(context {v})" in ctx
    assert heads["V1"] == {"F", "C"} and heads["V3"] == {"F", "C", "G", "H"}
    assert "S" in heads["V5"] and "T" not in heads["V5"] and "T" in heads["V6"]
    v3 = fam.context(state, settings.model_copy(update={"context": "V3"}), rows, None)
    v4 = fam.context(state, settings.model_copy(update={"context": "V4"}), rows, None)
    assert "Stage 0:" in v3 and "Stage 0:" not in v4  # H0 keeps stage 0's random config, H leaves it out
