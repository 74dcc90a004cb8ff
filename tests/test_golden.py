"""The golden layer: the scripted `fixed` engineer with a fixed seed gives the pinned per-stage configs, data
sets and metrics on the smoke preset (what is pinned and why: tests/support/golden.py).

The runs are the `fixed-s0` / `fixed-s1` runs of the session's smoke grid (conftest ``smoke_grid``), so this
layer trains nothing of its own. A difference fails with a unified diff of the pinned file. When the change
is intended, re-record and review `git diff tests/golden/`; the test never re-records:

    python -m tests.support.golden --record
"""

from __future__ import annotations

import json

import pytest

from tests.support.golden import SEEDS, diff, dumps, extract, golden_path


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_engineer_smoke_run_matches_the_golden_files(smoke_grid, seed):
    pinned = golden_path(seed)
    assert pinned.is_file(), f"{pinned} is missing: record it with `python -m tests.support.golden --record`"
    actual = dumps(extract(smoke_grid[0] / "runs" / f"fixed-s{seed}"))
    changes = diff(pinned.read_text(), actual, pinned.name)
    assert not changes, (f"the smoke run differs from {pinned.name}; if the change is intended, re-record with "
                         f"`python -m tests.support.golden --record` and review the diff:\n{changes}")


def test_pinned_files_are_canonical_and_a_difference_reads_as_a_diff():
    """Fast: the pinned files are what `dumps` writes (a re-record of the same run changes no byte), and one
    changed value shows as one -/+ line pair under its neighbours."""
    for seed in SEEDS:
        pinned = golden_path(seed).read_text()
        assert dumps(json.loads(pinned)) == pinned, golden_path(seed).name
    pinned = golden_path(0).read_text()
    doc = json.loads(pinned)
    doc["stage_1"]["config"]["num_instances"] += 1
    changes = diff(pinned, dumps(doc), "smoke-fixed-s0.json")
    removed = [ln for ln in changes.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in changes.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(removed) == len(added) == 1 and "num_instances" in removed[0] and "num_instances" in added[0]
    assert diff(pinned, pinned, "smoke-fixed-s0.json") == ""
