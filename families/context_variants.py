"""The engineer's context variants: which context modules each one shows (the paper's V1-V6).

Kept apart from `nodes/summarize_failures.py`, which renders the modules, so that the run settings
(`graph/settings.py`, `--context`) and the evals can name the variants without importing a node.
"""

from __future__ import annotations

VARIANTS: dict[str, tuple[str, ...]] = {
    "V1": ("F",),
    "V2": ("F", "G"),
    "V3": ("F", "G", "H0"),
    "V4": ("F", "G", "H"),
    "V5": ("F", "G", "H", "S"),
    "V6": ("F", "G", "H", "T"),
}
CONTEXT_VARIANTS: tuple[str, ...] = tuple(VARIANTS)  # the variant names, in order (Settings.context, --context)
