"""The report node: `report.md` and its plots, written from the run folder's files alone.

Everything here is recomputed from what earlier nodes saved (stage_k/config.json, metrics.json,
validation.json, stage_0/start/metrics.json (the warm start's own evaluation), final/metrics.json, and
settings.json / stage0_from.json of the run), so `python -m nodes.report RUN_DIR` rebuilds the same report
for any run folder, finished or not.

Every file is read as untrusted: JSON of the wrong type (a list where an object belongs, a string where a
number belongs) counts as absent, never as a crash; text that came from the engineer (its rationale, the
reasons quoting it) and names of the run are escaped (`nodes.inert.for_markdown`: no HTML, no headings,
no control characters) before they reach report.md. Files are written atomically (`trainer.files`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from families import DEFAULT_TASK, family_of
from families.metrics import final_table_md, upgrade_metrics
from nodes.inert import for_markdown, md_inline
from nodes.report_plots import level_rate as _level_rate
from nodes.report_plots import num as _num
from nodes.report_plots import plot  # noqa: F401 - the report's plots, also for tests
from nodes.report_plots import sizes as _sizes
from trainer.files import stage_dir, stage_numbers, write_text_atomic


def _read_json(path: Path, unreadable: list[str] | None = None) -> dict | None:
    """The JSON object in `path`; None when the file is missing, unreadable, not JSON, or not an object. With
    `unreadable`, a file that exists but gives no object is named there (`stage_0/metrics.json: not JSON`)."""
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or bytes that are not UTF-8
        if unreadable is not None:
            unreadable.append(f"{path.parent.name}/{path.name}: {'not JSON' if isinstance(e, ValueError) else type(e).__name__}")
        return None
    if not isinstance(obj, dict) and unreadable is not None:
        unreadable.append(f"{path.parent.name}/{path.name}: not a JSON object")
    return obj if isinstance(obj, dict) else None


def _decisions(validation: Any) -> list[dict]:
    decisions = validation.get("decisions") if isinstance(validation, dict) else None
    return [d for d in decisions if isinstance(d, dict)] if isinstance(decisions, list) else []


def _stage_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    return [(k, stage_dir(run_dir, k)) for k in stage_numbers(run_dir)]


def _pct(x: Any) -> str:
    return "–" if _num(x) is None else f"{100 * x:.1f}"


def collect(run_dir: Path) -> dict[str, Any]:
    """Per-stage configs, metrics and engineer decisions, plus the final benchmark metrics."""
    stages, bad = [], []  # bad: the stage files that exist but cannot be read, named in the report and the log
    for k, d in _stage_dirs(run_dir):
        stages.append(
            {
                "stage": k,
                "config": _read_json(d / "config.json", bad),
                "metrics": upgrade_metrics(_read_json(d / "metrics.json", bad) or {}),
                "validation": _read_json(d / "validation.json", bad),
                "env_stats": _read_json(d / "env_stats.json", bad),
            }
        )
    return {
        "stages": stages,
        "unreadable": bad,
        "start": upgrade_metrics(_read_json(stage_dir(run_dir, 0) / "start" / "metrics.json")),
        "final": upgrade_metrics(_read_json(run_dir / "final" / "metrics.json")),
        "final_cpu": upgrade_metrics(_read_json(run_dir / "final_cpu" / "metrics.json")),
        "settings": _read_json(run_dir / "settings.json") or {},
        "stage0_from": _read_json(run_dir / "stage0_from.json"),
        "final_mtime": _mtime(run_dir / "final" / "metrics.json"),
        **task_levels(_read_json(run_dir / "settings.json") or {}),
    }


def task_levels(settings: dict[str, Any]) -> dict[str, Any]:
    """The run's family's levels, the tables' and plots' axis (`LoopFamily.report_levels`: [{index, label, column}],
    MAPF's grid sizes or a task's levels) and the key of its levers (`lever`: `sizes` or `levels`); a settings.json
    that names no task is the default task's (runs from before the setting), one whose task does not load here
    has no levels (the axis is then read from the metrics)."""
    name = settings.get("task", DEFAULT_TASK) if isinstance(settings, dict) else DEFAULT_TASK
    try:
        family = family_of(name if isinstance(name, str) else DEFAULT_TASK)
        return {"levels": family.report_levels(), "lever": family.shape.key}
    except (ValueError, ImportError, AttributeError):
        return {"levels": None, "lever": None}


def share_levels(data: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The levels of a run whose levers are level shares (None for per-size knobs)."""
    return data.get("levels") if data.get("lever") == "levels" else None


def axis(data: dict[str, Any]) -> tuple[list[int], Any]:
    """The per-level columns of the tables, from the family (MAPF's grid sizes "3x3", a task's levels "L0"), or
    the levels the metrics name when the family does not load here."""
    levels = data.get("levels")
    if levels:
        columns = {lv["index"]: lv["column"] for lv in levels}
        return list(columns), columns.__getitem__
    found = {int(k.rsplit("_", 1)[1]) for s in data.get("stages") or [] for k in (s.get("metrics") or {})
             if k.startswith("eval/valid_rate/level_") and k.rsplit("_", 1)[1].isdigit()}
    return sorted(found), str


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def paper_table_md(final: dict[str, Any], label: str) -> str:
    """The paper's headline table: one row per run, `valid / optimal` (%) per agent count (3, 4, 5)."""
    by_agents = final.get("by_agents")
    agents = sorted({int(a) for a in (by_agents if isinstance(by_agents, dict) else {}) if str(a).isdigit()} | {3, 4, 5})
    cells = []
    for a in agents:
        v, o = _num(final.get(f"final/valid_rate/agents_{a}")), _num(final.get(f"final/optimal_rate/agents_{a}"))
        ok = v is not None and o is not None
        cells.append(f"{100 * v:.2f} / {100 * o:.2f}" if ok else "–")
    return "\n".join([
        "| run | " + " | ".join(f"{a} agents" for a in agents) + " |",
        "|---|" + "---|" * len(agents),
        f"| {md_inline(label)} | " + " | ".join(cells) + " |",
    ]) + "\n"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s"


def _wall_time(data: dict[str, Any]) -> str:
    """From the run's start (settings.json's provenance) to its final benchmark's metrics, or to now while it
    runs; a resumed run counts the time it was stopped too."""
    prov = (data.get("settings") or {}).get("provenance")
    start = _num(prov.get("started_unix")) if isinstance(prov, dict) else None
    if start is None:
        return "unknown (no start time in settings.json)"
    end = data.get("final_mtime")
    if isinstance(end, float):
        return _duration(end - start) + " (start to final benchmark, stops included)"
    import time

    return _duration(time.time() - start) + " so far (no final benchmark yet)"


def header_lines(data: dict[str, Any], title: str) -> list[str]:
    """The table report.md opens with: run, preset, engineer, seed, policy model, commit, start, wall time."""
    settings = data.get("settings") or {}
    prov = settings.get("provenance") if isinstance(settings.get("provenance"), dict) else {}
    git = prov.get("git") if isinstance(prov.get("git"), dict) else {}
    commit = git.get("commit")
    commit_text = "unknown" if not commit else f"`{_code(str(commit)[:12])}`" + (
        " (uncommitted changes)" if git.get("dirty") else "")
    mach = prov.get("machine") if isinstance(prov.get("machine"), dict) else {}
    gpus = mach.get("gpus") if isinstance(mach.get("gpus"), list) else []
    machine_text = (f"{md_inline(str(mach.get('cpu', '?')))}, {md_inline(str(mach.get('cores', '?')))} cores, "
                    + (md_inline(", ".join(map(str, gpus))) if gpus else "no GPU")) if mach else "unknown"
    pk = prov.get("packages") if isinstance(prov.get("packages"), dict) else {}
    packages = ", ".join(f"{md_inline(str(k))} {md_inline(str(v))}" for k, v in pk.items() if v) or "unknown"
    rows = [
        ("run", f"`{_code(settings.get('run_id') or title)}`"),
        ("preset", f"`{_code(settings.get('preset', '?'))}`"),
        ("engineer", f"`{_code(settings.get('engineer', '?'))}`"),
        ("seed", f"`{_code(settings.get('seed', '?'))}`"),
        ("policy model", f"`{_code(settings.get('policy_model', '?'))}`"),
        ("commit", commit_text),
        ("started", md_inline(str(prov.get("started_at") or "unknown"))),
        ("wall time", _wall_time(data)),
        ("machine", machine_text),
        ("tracking", _tracking_text(settings)),
        ("packages", packages),
    ]
    return ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows] + [""]


def _tracking_text(settings: dict[str, Any]) -> str:
    train = settings.get("train") if isinstance(settings.get("train"), dict) else {}
    targets = str(train.get("report_to") or "tensorboard")
    if targets == "none":
        return "none (train.report_to=none)"
    out = []
    if "tensorboard" in targets:
        out.append("TensorBoard run `tb/` (`tensorboard --logdir tb`)")
    if "wandb" in targets:
        out.append("Weights & Biases (`wandb/` when offline)")
    return "; ".join(out) + ", one global step across stages"


def zero_variance_stages(data: dict[str, Any]) -> list[int]:
    """Stages whose GRPO groups all had zero reward variance (no learning signal at all)."""
    out = []
    for s in data["stages"]:
        m = s["metrics"] or {}
        z = _num(m.get("train/zero_std_groups_trained"))
        if z is None or z != z:  # absent or NaN (no groups counted): the share before dynamic sampling
            z = _num(m.get("train/zero_std_groups"))
        if "train/steps" in m and z is not None and z >= 1.0:
            out.append(s["stage"])
    return out


def unheard_warning(data: dict[str, Any]) -> str | None:
    """A warning when the engineer's proposals went unused: every attempt for a stage was unusable (an empty or
    cut reply, no JSON, an illegal config) and the config before was kept. When that held for every stage the run
    trained as the `fixed` engineer would, and says so."""
    finals = []
    for s in data["stages"]:
        engineer = [d for d in _decisions(s["validation"]) if d.get("by") != "person"]
        if engineer:
            finals.append((s["stage"], engineer[-1]))
    kept = [(k, d) for k, d in finals if d.get("decision") == "kept_previous"]
    if not kept:
        return None
    name = md_inline(str((data.get("settings") or {}).get("engineer", "?")))
    last = kept[-1][1]
    why = md_inline(str(last.get("reply") or (last.get("errors") or ["no reason recorded"])[0]))[:400]
    if len(kept) == len(finals):
        return (f"**Warning: the {name} engineer never produced a usable proposal. For each of its {len(finals)} "
                "stage(s) every attempt was unusable and the config before was kept, so this run trained as "
                f"ENGINEER=fixed would: it says nothing about the {name} engineer.** Last reason (stage "
                f"{kept[-1][0]}): {why}")
    stages = ", ".join(str(k + 1) for k, _ in kept)
    return (f"**Warning: the {name} engineer's proposals for stage(s) {stages} were all unusable; those stages kept "
            f"the config before them.** Last reason: {why}")


def _final_table_or_note(metrics: dict[str, Any], source: str) -> str:
    """`final_table_md` of a final evaluation's metrics, or one line saying why it cannot be built."""
    try:
        return final_table_md(metrics)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        return f"(the per-size table cannot be built from {source}: {md_inline(type(e).__name__)})\n"


def _criterion_name(data: dict[str, Any]) -> str:
    """What `optimal` means in this run's tables, from its settings (`train.optimality`; runs from before it
    existed scored the sum of costs)."""
    crit = ((data.get("settings") or {}).get("train") or {}).get("optimality", "soc")
    return ("the makespan equals the instance's optimal makespan (the paper's \"makespan-optimal\")"
            if crit == "makespan" else "the sum of costs equals the instance's optimal sum of costs")


def _sampled_cell(m: dict[str, Any], prefix: str = "eval") -> str:
    """`41.2 [35-48]`: the sampled valid % (mean@k) with its interval, or a dash where it was not measured."""
    lo, hi = _num(m.get(f"{prefix}/sampled_valid_rate_low")), _num(m.get(f"{prefix}/sampled_valid_rate_high"))
    rate = _pct(m.get(f"{prefix}/sampled_valid_rate"))
    return rate if lo is None or hi is None or rate == "–" else f"{rate} [{100 * lo:.0f}-{100 * hi:.0f}]"


def render(data: dict[str, Any], plots: list[str], title: str) -> str:
    lines = [f"# Run report: {md_inline(title)}", ""]
    for bad in data.get("unreadable") or []:
        lines += [f"**Unreadable file: `{_code(bad)}`**: its stage's figures are missing from this report.", ""]
    lines += header_lines(data, title)
    shared = data.get("stage0_from")
    if shared:
        lines += [
            f"Stage 0 was shared from the donor run `{_code(shared.get('donor'))}` (its checkpoint "
            f"`{_code(shared.get('donor_checkpoint_id'))}`): it was generated, trained and evaluated once there, not in "
            "this run; its files in stage_0/ are the donor's bytes (hard links where possible). See stage0_from.json.",
            "",
        ]
    warning = unheard_warning(data)
    if warning:
        lines += [warning, ""]
    criterion = _criterion_name(data)
    keys, head = axis(data)
    levels = share_levels(data)
    lines += [
        "## Validation per stage",
        "",
        f"Optimal means {criterion}.",
        "",
    ]
    start = data.get("start")
    rows = [("start", start)] if start else []
    rows += [(str(s["stage"]), s["metrics"]) for s in data["stages"] if s["metrics"]]
    sampled = [m for _, m in rows if _num(m.get("eval/sampled_valid_rate")) is not None]
    lines += ["| stage | valid % | " + ("sampled valid % | " if sampled else "") + "optimal % | "
              + " | ".join(head(n) for n in keys) + " |", "|---|---|---|" + "---|" * (len(keys) + bool(sampled))]
    for name, m in rows:
        cells = [f"{_pct(_level_rate(m, 'valid_rate', n))}" for n in keys]
        lines.append(
            f"| {name} | {_pct(m.get('eval/valid_rate'))} | "
            + (f"{_sampled_cell(m)} | " if sampled else "") + f"{_pct(m.get('eval/optimal_rate'))} | "
            + " | ".join(cells)
            + " |"
        )
    if levels:
        lines += ["", "Levels: " + "; ".join(f"L{lv['index']} {md_inline(lv['label'])}" for lv in levels) + "."]
    lines += ["", "Per-size cells: valid %."
              + (" Start: the cached SFT warm start stage 0 began from, before any GRPO step, evaluated the same way."
                 if start else "")
              + (f" Sampled valid: the mean@{sampled[-1].get('eval/samples_k')} of answers sampled at temperature "
                 f"{sampled[-1].get('eval/sample_temperature')}, with its 95 % interval over questions and samples."
                 if sampled else ""), ""]
    settings = data.get("settings") or {}
    counts = sorted({int(m["eval/n"]) for _, m in rows if isinstance(m.get("eval/n"), int | float)})
    if counts:
        n = counts[-1]
        half = 100 * 1.96 * (0.25 / n) ** 0.5  # the widest binomial 95 % half-width, at a 50 % rate
        lines += [
            f"Validation answers per stage: {', '.join(map(str, counts))} (split "
            f"`{_code(settings.get('eval_split', '?'))}`, greedy, each verified); at {n} answers a valid rate is "
            f"known to about ±{half:.1f} points (95 %).",
            "",
        ]
    lines += [f"![{p}]({p})" for p in plots] + [""]
    trained = [s for s in data["stages"] if "train/steps" in (s["metrics"] or {})]
    if trained:
        lines += [
            "## Training per stage",
            "",
            "| stage | GRPO steps | s/step | reward mean | sampled valid % | zero-variance groups % "
            "| trained on % | stage s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in trained:
            m = s["metrics"]

            def num(key: str, fmt: str, m: dict = m) -> str:
                v = m.get(key)
                if fmt == "d":
                    return str(v) if isinstance(v, int) and not isinstance(v, bool) else "–"
                return format(v, fmt) if _num(v) is not None else "–"

            lines.append(
                f"| {s['stage']} | {num('train/steps', 'd')} | {num('train/seconds_per_step', '.1f')} | "
                f"{num('train/reward_mean', '.3f')} | {_pct(m.get('train/valid_rate'))} | "
                f"{_pct(m.get('train/zero_std_groups'))} | {_pct(m.get('train/zero_std_groups_trained'))} | "
                f"{num('train/seconds', '.0f')} |"
            )
        lines += [
            "",
            "A zero-variance group (every completion of a prompt scored the same) gives GRPO no signal; at 100 % "
            "GRPO moved no weight in that stage. \"Trained on\": the share left after dynamic sampling replaced such "
            "groups with fresh ones that had signal (`train.resample_rounds`).",
            "",
        ]
        for k in zero_variance_stages(data):
            lines += [f"**Warning: stage {k} had zero reward variance in every GRPO group: it learned nothing "
                      "(every completion of a prompt scored the same).**", ""]
    lines += ["## Configurations and the engineer's decisions", ""]
    top = ((data.get("settings") or {}).get("train") or {}).get("max_train_size")
    if isinstance(top, int) and keys and top < keys[-1] and not levels:
        lines += [
            f"Only sizes 3x3-{top}x{top} were trained (`train.max_train_size` {top}): each table is the configuration "
            f"trained, with any share an engineer gave larger sizes moved onto 3x3-{top}x{top}.",
            "",
        ]
    for s in data["stages"]:
        cfg = _sizes(s["config"])
        lines.append(f"### Stage {s['stage']}")
        shares = (s["config"] or {}).get("levels") if levels and isinstance(s["config"], dict) else None
        if isinstance(shares, dict):
            lines += ["", "| level | what | share of the stage's questions |", "|---|---|---|"]
            for lv in levels:
                share = _num(shares.get(str(lv["index"]), shares.get(lv["index"], 0.0))) or 0.0
                lines.append(f"| L{lv['index']} | {md_inline(lv['label'])} | {share:.3f} |")
        if cfg:
            lines += ["", "| size | data | hole | wait |", "|---|---|---|---|"]
            for n in keys:
                k = cfg.get(n, {})
                lines.append(
                    f"| {n}x{n} | {k.get('data_ratio', 0):.3f} | {k.get('hole_ratio', 0):.3f} | "
                    f"{k.get('wait_ratio', 0):.3f} |"
                )
        decisions = _decisions(s["validation"])
        engineer = [d for d in decisions if d.get("by") != "person"]
        person = [d for d in decisions if d.get("by") == "person"]
        if engineer:
            last = engineer[-1]
            lines += [
                "",
                f"Engineer proposal for stage {s['stage'] + 1}: **{md_inline(last.get('decision', '?'))}** after "
                f"{len(engineer)} attempt(s) — {md_inline(last.get('reason', ''))}",
            ]
            if last.get("rationale"):
                lines += ["", "> " + for_markdown(str(last["rationale"])[:2000]).replace("\n", "\n> ")]
        if person:
            last = person[-1]
            lines += ["", f"Person's decision (--approve): **{md_inline(last.get('decision', '?'))}** — "
                      f"{md_inline(last.get('reason', ''))}"]
        lines.append("")
    final = data["final"]
    if levels:
        lines += [f"## Final evaluation (held-out split `{_code((data.get('settings') or {}).get('final_split', '?'))}`)",
                  ""]
        if final:
            k = final.get("final/samples_k")  # mean@k beside the greedy rate, where answers were sampled
            lines += [f"{final.get('final/n', '?')} questions: valid {_pct(final.get('final/valid_rate'))} %"
                      + (f", sampled valid {_sampled_cell(final, 'final')} % (mean@{k} at temperature "
                         f"{final.get('final/sample_temperature')})" if k else "") + ".", "",
                      "| level | what | n | valid % |" + (" sampled valid % |" if k else ""),
                      "|---|---|---|---|" + ("---|" if k else "")]
            for lv in levels:
                row = (final.get("by_level") or {}).get(str(lv["index"])) or {}
                lines.append(f"| L{lv['index']} | {md_inline(lv['label'])} | {row.get('n', 0)} | "
                             f"{_pct(row.get('valid_rate'))} |" + (f" {_pct(row.get('sampled_valid_rate'))} |" if k else ""))
        else:
            lines.append("(no final evaluation yet)")
        return "\n".join(lines) + "\n"
    lines += ["## Final benchmark (held-out, more agents than in training)", ""]
    if final:
        settings = data.get("settings") or {}
        label = f"{title} ({settings.get('policy_model', '?')}, {settings.get('engineer', '?')} engineer)"
        table = _final_table_or_note(final, "final/metrics.json")
        lines += [
            f"{final.get('final/n', '?')} instances: valid {_pct(final.get('final/valid_rate'))} %, "
            f"optimal {_pct(final.get('final/optimal_rate'))} %.",
            "",
            f"In the paper's format (valid % / optimal %, aggregate over sizes; optimal means {criterion}):",
            "",
            paper_table_md(final, label),
            table,
        ]
        cpu = data.get("final_cpu")
        if cpu:
            cpu_table = _final_table_or_note(cpu, "final_cpu/metrics.json")
            lines += [
                f"Beside it, the CPU-scale held-out split `{md_inline(str(cpu.get('final/split', '?')))}` (where a small "
                f"policy is not at 0): {cpu.get('final/n', '?')} instances, valid {_pct(cpu.get('final/valid_rate'))} %, "
                f"optimal {_pct(cpu.get('final/optimal_rate'))} %.",
                "",
                cpu_table,
            ]
    else:
        lines.append("(no final benchmark yet)")
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    data = collect(run_dir)
    plots = plot(data, run_dir)
    out = run_dir / "report.md"
    write_text_atomic(out, render(data, plots, run_dir.name))
    return out


def _code(x: Any) -> str:
    """A value shown inside backticks: one line, no backticks, no control characters."""
    return md_inline(str(x)).replace("`", "'")


def report(state: dict, runtime) -> dict:
    """Graph node: write report.md (+ plots) into the run folder."""
    path = write_report(runtime.context.run_dir)
    bad = collect(Path(runtime.context.run_dir))["unreadable"]
    return {"log": [f"WARNING unreadable file {b}: its stage's figures are missing from report.md" for b in bad]
            + [f"report written: {path}"]}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m nodes.report RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    if not run_dir.is_dir():
        print(f"error: {run_dir} is not a folder; give a run folder (runs/<run-id>)", file=sys.stderr)
        return 2
    try:
        print(write_report(run_dir))
    except OSError as e:
        print(f"error: cannot write the report into {run_dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
