"""Which context makes a good engineer? The loop once per (context variant, seed) for one engineer.

    python -m evals.ablate_context --config evals/configs/ablate_cpu.yaml [--dry-run] [--tables-only]
        [--fresh | --out DIR]

Variants (PAPER.md): V1=F, V2=F+G, V3=F+G+H (with stage 0), V4=F+G+H (without), V5=V4+S, V6=V4+T.
Each variant runs `python -m graph.run --engineer <engineer> --context <V>` once per seed in its own run
folder `<runs_dir>/<V>-s<seed>`; `baselines:` adds other engineers (e.g. `fixed`) as extra rows so the
gap can be measured against a curriculum that does not redesign. Same seeds, budgets, resume rules,
statistics, tables, plots, stage-0 sharing (`share_stage0`) and reproduction flags (`--fresh`, `--out DIR`;
committed results are never overwritten) as `evals.compare_engineers` (both use `evals.loop`).
"""

from __future__ import annotations

import sys

from pydantic import Field

from evals import loop
from evals.config import EvalConfigError, LoopConfig
from evals.pairs import Arm
from families.context_variants import CONTEXT_VARIANTS


class AblateConfig(LoopConfig):
    """ablate_context config: the shared loop fields plus the engineer, the variants and extra baselines."""

    engineer: str = Field("self", description="the engineer whose context is varied")
    engineer_model: str | None = Field(None, description="model id for an API engineer")
    engineer_base_url: str | None = Field(None, description="base URL of a custom endpoint")
    engineer_api_key_env: str | None = Field(
        None, description="environment variable holding the endpoint's key (its runs see it as ENGINEER_API_KEY)"
    )
    variants: list[str] = Field(default_factory=lambda: list(CONTEXT_VARIANTS), min_length=1, description="V1..V6")
    baselines: list[str] = Field(default_factory=list, description="extra engineers run as rows (e.g. fixed)")


def arms_of(cfg: AblateConfig) -> list[Arm]:
    bad = [v for v in cfg.variants if v not in CONTEXT_VARIANTS]
    if bad:
        raise EvalConfigError(f"variants: {bad} unknown; allowed: {', '.join(CONTEXT_VARIANTS)}")
    arms = [Arm(label=v, engineer=cfg.engineer, context=v, engineer_model=cfg.engineer_model,
                engineer_base_url=cfg.engineer_base_url, api_key_env=cfg.engineer_api_key_env) for v in cfg.variants]
    arms += [Arm(label=b, engineer=b) for b in cfg.baselines if b not in cfg.variants]
    return arms


def plan(cfg: AblateConfig) -> tuple[AblateConfig, list[Arm], str]:
    """The variants (and baselines) as arms, the config as it is, and the title."""
    return cfg, arms_of(cfg), (f"Context ablation for engineer `{cfg.engineer}` ({cfg.preset} preset, "
                               f"seeds {cfg.seeds})")


def main(argv: list[str] | None = None) -> int:
    return loop.main(argv, prog="python -m evals.ablate_context", description=__doc__.split("\n")[0],
                     model=AblateConfig, plan=plan, arm_header="context")


if __name__ == "__main__":
    sys.exit(main())
