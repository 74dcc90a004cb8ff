"""The one repair policy, the same for every family: what becomes of a proposal once its family has checked it.

A family's `check` (one pure function: strict check, repair, feasibility) returns a `Checked`; `decide` turns it
into the decision recorded in validation.json (docs/design.md defines each value):

- `accepted`: valid as proposed;
- `normalised`: invalid only by rounding (shares summing to 0.999, or percentages summing to 100), rescaled to
  sum to 1 at once, with a note, never sent back;
- `retry`: outside the legal space (or infeasible) while attempts remain: sent back with the reason;
- `projected`: outside the legal space on the last attempt: the nearest valid config (the family's projection);
- `kept_previous`: nothing usable on the last attempt: the current config is kept.

`validate_config`, `--approve` (a person's edit, checked as a last attempt) and `--dry-run` (a first attempt)
all go through `check` and `decide`, so a decision means the same for every family and every caller.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ROUNDING_TOL = 0.01  # shares summing to within 1 % of 1 (or of 100, as percentages) are off only by rounding


@dataclass
class Checked:
    """What a family's `check` found: the config dump to use (None: unusable), how it was reached (`accepted`,
    `normalised` or `projected`; None when unusable), the errors of the proposal as given, notes of every change,
    and the feasibility dry-run's record (None where the family has none)."""

    config: dict[str, Any] | None
    how: str | None = None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    feasibility: dict[str, Any] | None = None


def may_project(attempt: int, max_attempts: int) -> bool:
    """Whether a proposal outside the legal space is projected (the last attempt) rather than sent back."""
    return attempt >= max_attempts


def decide(checked: Checked, attempt: int, max_attempts: int) -> str:
    """The decision for a checked proposal at `attempt` of `max_attempts` (see the module docstring)."""
    if checked.config is not None:
        return checked.how or "accepted"
    return "retry" if attempt < max_attempts else "kept_previous"


def rounded_shares(shares: Any) -> tuple[dict[str, float], str] | None:
    """`shares` rescaled to sum to 1, with a note, when they are off only by rounding: every value a finite number
    >= 0 and their sum within `ROUNDING_TOL` of 1 (or of 100, every value at most 100: percentages). None when they
    sum to 1 already, or are off by more than rounding (then the proposal is outside the legal space)."""
    if not isinstance(shares, dict) or not shares:
        return None
    values = list(shares.values())
    try:
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                   for v in values):
            return None
        total = float(sum(values))
    except (OverflowError, TypeError):  # an integer too large for a float
        return None
    if abs(total - 1.0) <= 1e-6:
        return None
    if abs(total - 1.0) <= ROUNDING_TOL:
        what = f"shares summed to {total:.6g}"
    elif abs(total - 100.0) <= 100 * ROUNDING_TOL and all(v <= 100 for v in values):
        what = f"shares summed to {total:.6g} (percentages)"
    else:
        return None
    return {str(k): float(v) / total for k, v in shares.items()}, f"{what}; normalised to sum to 1"
