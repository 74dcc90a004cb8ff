"""Which engineer designs the best curriculum? The full loop once per (engineer, seed), then the paper's table.

    python -m evals.compare_engineers --config evals/configs/compare_smoke.yaml [--dry-run] [--tables-only]
        [--fresh | --out DIR]

Every engineer in the config (`self`, `base`, `openai`, `gemini`, a custom OpenAI-compatible endpoint,
`fixed`, `random`, `learnability`, `threshold`) runs `python -m graph.run` once per seed, each in its own
run folder `<runs_dir>/<engineer>-s<seed>`. The same seed gives every engineer the same stage-0 config,
data and training seed; the same preset and `set:` overrides give every engineer the same budget.

- API engineers without a key are skipped with a visible `[skip]` line (and a note under the table). Each
  custom endpoint can name its own key variable (`api_key_env`); only that engineer's runs see it, as
  ENGINEER_API_KEY, and it is never written to a log, timings.json or a run folder.
- Stage 0 does not depend on the engineer, so by default (`share_stage0: true`) it is trained once per
  seed: the seed's first run is the donor, the others start with `graph.run --stage0-from <donor>`
  (see `evals.pairs`); `--dry-run` shows which run forks from which donor.
- Finished pairs (final/metrics.json and report.md) are never redone; unfinished ones are continued with
  `graph.run --resume`. Rerunning the same command after a crash or Ctrl-C picks up where it stopped.
  A pair whose verdicts are already in `<out>/verdicts/` (committed from another machine or day) counts
  as finished even when its run folder is gone, so a long grid can be built up over several sittings.
- `--dry-run` checks the config, the engineers and their keys, and every run's settings, and prints the
  planned commands; no model is called and no run folder is made.
- `--tables-only` rebuilds the tables and plots from `<out>/verdicts/` alone (what is committed).
- Reproducing a config: `--fresh` runs it anew into `<out>-<UTC time>` beside its `out` (new run folders too),
  `--out DIR` into DIR (run folders in `runs/evals/<DIR name>`). Committed results are never overwritten: a
  config whose `out` holds committed results runs into it only to continue that grid with the same settings;
  other settings, another config's runs, or nothing left to run are refused with one line naming --fresh / --out
  (`evals.pairs.guard_committed`).

Outputs in `<out>`: table.md / table.csv / table.json (per agent count each size's valid % / optimal % and
Sum, the unweighted mean over sizes; pooled rates per agent count and wait subset; mean [95% interval] over
seeds and instances, `evals.intervals`; gaps to the baseline paired by seed; failure shares), validation_per_stage.png, allocation.png,
timings.json, events.log, logs/<pair>.log, verdicts/<pair>/ (the per-instance verdict files).

Config fields (YAML or TOML): see `CompareConfig` below and `evals.config.LoopConfig`.
"""

from __future__ import annotations

import sys

from pydantic import BaseModel, ConfigDict, Field

from evals import loop
from evals.config import EvalConfigError, LoopConfig
from evals.pairs import Arm


class EngineerSpec(BaseModel):
    """An engineer with options; a plain string in the config means just the name."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="engineer kind: self | base | openai | gemini | fixed | ... | custom endpoint")
    label: str | None = Field(None, description="name in the tables and run folders (default: name)")
    model: str | None = Field(None, description="model id for an API engineer (graph.run --engineer-model)")
    base_url: str | None = Field(None, description="base URL of a custom endpoint (--engineer-base-url)")
    api_key_env: str | None = Field(
        None, description="environment variable holding this endpoint's key; its runs see it as ENGINEER_API_KEY "
        "(unset: the engineer is skipped with a visible line; None: ENGINEER_API_KEY and its fallbacks as usual)"
    )


class CompareConfig(LoopConfig):
    """compare_engineers config: the shared loop fields plus the engineers and the context."""

    engineers: list[str | EngineerSpec] = Field(min_length=1, description="engineers compared, in table order")
    context: str | None = Field(None, description="engineer context variant V1..V6 for every LLM engineer")
    baseline: str | None = Field("fixed", description="engineer the gaps are measured against (needs to be listed)")


def arms_of(cfg: CompareConfig) -> list[Arm]:
    arms = []
    for e in cfg.engineers:
        spec = EngineerSpec(name=e) if isinstance(e, str) else e
        arms.append(Arm(label=spec.label or spec.name, engineer=spec.name, context=cfg.context,
                        engineer_model=spec.model, engineer_base_url=spec.base_url, api_key_env=spec.api_key_env))
    labels = [a.label for a in arms]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise EvalConfigError(f"engineers: {dup} listed twice; give one of them a distinct `label`")
    return arms


def plan(cfg: CompareConfig) -> tuple[CompareConfig, list[Arm], str]:
    """The engineers as arms, the config (without gap columns when the baseline is not listed) and the title."""
    arms = arms_of(cfg)
    if cfg.baseline and cfg.baseline not in [a.label for a in arms]:
        print(f"note: baseline {cfg.baseline!r} is not among the engineers; no gap columns", file=sys.stderr)
        cfg = cfg.model_copy(update={"baseline": None})
    return cfg, arms, f"Engineers compared ({cfg.preset} preset, seeds {cfg.seeds})"


def main(argv: list[str] | None = None) -> int:
    return loop.main(argv, prog="python -m evals.compare_engineers", description=__doc__.split("\n")[0],
                     model=CompareConfig, plan=plan, arm_header="engineer")


if __name__ == "__main__":
    sys.exit(main())
