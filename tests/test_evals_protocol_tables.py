"""evals/: the paper's table layout, honest intervals and committed tables that stay true.

- Sum is the unweighted mean of the per-size rates (per seed, then over seeds), not the pooled rate.
- Intervals stay inside [0, 100] % for rates near 0 and near 100 (1 seed and 3 seeds), gaps inside
  [-100, 100]; the gap to the baseline is paired by seed and by instance.
- The optimality criterion (sum of costs or makespan) is computed per row and named in every table.
- The paper's published rows are what PAPER.md says and appear only where a reader compares.
- Every committed table under evals/results/ is rebuilt from its committed verdicts, byte for byte.
"""

from __future__ import annotations

import csv
import importlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from evals import intervals, loop, published, stats, tables
from evals.config import config_command, repo_path
from evals.plots import error_bars

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "evals" / "results"
# results folders without an eval table built from verdict files, and why
EXCLUDED = {
    "default_run_cpu": "one `python -m graph.run` (report.md, progress.txt, plots written by the run's report "
                       "node), no eval table",
    "default_run_cpu_fresh": "the same default run on a fresh machine: a run report, no eval table",
    "default_run_cpu_amd": "the same default run, fresh, on an AMD EPYC Zen 4: a run report, no eval table",
    "cpu_long_run_xeon": "one `python -m graph.run --preset cpu-long` on a Xeon: a run report, no eval table",
    "learning_cpu": "outputs of evals.bench benchmarks (JSON and text), no eval table",
    "rg_candidates": "outputs of evals.bench.bench_rg (one JSON per arm, every answer, packed), no eval table",
    "rg_allocation": "outputs of evals.bench.bench_rg, one JSON per allocation arm, and bench_rg_report's tables",
    "filtered_sampler": "the output of evals.bench.bench_filtered_sampling (samples/s and stage seconds), no eval table",
    "rg_load": "outputs of evals.bench.bench_rg_load (load and first-stage seconds), no eval table",
    "trainer_import": "the output of evals.bench.bench_trainer_import (import seconds and memory), no eval table",
    "engineer_reask": "the output of evals.bench.bench_reask (seconds of a cut reply asked again), no eval table",
}
OUTPUTS = ("table.md", "table.csv", "table.json", "failures.csv")


def write_verdicts(folder: Path, rows: list[dict], final_split: str = "test-mini") -> Path:
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "settings.json").write_text(json.dumps({"final_split": final_split}))
    return folder


def row(i: str, size: int, valid: bool, agents: int = 3, wait: float = 0.25, **kw) -> dict:
    return {"id": i, "size": size, "num_agents": agents, "tags": {"agents": agents, "wait": wait}, "valid": valid,
            "optimal": kw.pop("optimal", valid), "failure": None if valid else "conflict", **kw}


def rows_from(pattern: dict[int, list[bool]], agents: int = 3) -> list[dict]:
    """size -> successes of that size's instances, as verdict rows."""
    return [row(f"a{agents}-s{z}-{j}", z, ok, agents) for z, oks in pattern.items() for j, ok in enumerate(oks)]


# --------------------------------------------------------------------------- Sum over sizes


def test_sum_is_the_unweighted_mean_of_per_size_rates(tmp_path):
    # seed 0: 3/4, 2/10, 2/2 -> Sum (0.75 + 0.2 + 1) / 3 = 0.65, pooled 7/16; seed 1: 1/4, 5/10, 0/2 -> 0.25
    per_seed = {0: {3: [1, 1, 1, 0], 4: [1, 1] + [0] * 8, 5: [1, 1]},
                1: {3: [1, 0, 0, 0], 4: [1] * 5 + [0] * 5, 5: [0, 0]}}
    verdicts = {("x", s): write_verdicts(tmp_path / f"x-s{s}", rows_from({z: [bool(v) for v in oks]
                                                                           for z, oks in p.items()}))
                for s, p in per_seed.items()}
    table = stats.summarize(verdicts, ["x"], None)
    by_hand = {s: sum(sum(oks) / len(oks) for oks in p.values()) / len(p) for s, p in per_seed.items()}
    assert by_hand == pytest.approx({0: 0.65, 1: 0.25})
    total = table["per_size"]["x"]["agents_3"]["valid"]["sum"]
    assert total["per_seed"] == pytest.approx({"0": 0.65, "1": 0.25})
    assert total["mean"] == pytest.approx(0.45)
    # the per-size cells are each size's mean over seeds, and Sum is also the mean of those
    sizes = table["per_size"]["x"]["agents_3"]["valid"]["sizes"]
    assert {z: c["mean"] for z, c in sizes.items()} == pytest.approx({"3": 0.5, "4": 0.35, "5": 0.5})
    assert total["mean"] == pytest.approx(sum(c["mean"] for c in sizes.values()) / 3)
    pooled = table["rows"]["x"]["agents_3"]["valid"]["mean"]
    assert pooled == pytest.approx((7 / 16 + 6 / 16) / 2) and pooled != pytest.approx(total["mean"])

    md = tables.table_markdown(table, title="t", command=None)
    assert "| x | 2 | 50.0 / 50.0 | 35.0 / 35.0 | 50.0 / 50.0 | 45.0 [" in md
    csv_rows = [r for r in tables.table_rows(table) if r["layout"] == "sum" and r["subset"] == "agents_3"]
    assert {r["metric"]: r["mean"] for r in csv_rows} == pytest.approx({"valid": 0.45, "optimal": 0.45})


# --------------------------------------------------------------------------- intervals near 0 and 100


@pytest.mark.parametrize("seeds", [1, 3])
@pytest.mark.parametrize("k_of", ["zero", "one", "near0", "near100"])
def test_rate_intervals_stay_inside_0_100(seeds, k_of):
    near = {0: 2, 1: 1, 2: 8}  # of 36: compare_cpu's parse_error shares, where t gave "10.2 ± 26.1"
    ks = {"zero": lambda s: 0, "one": lambda s: 36, "near0": lambda s: near[s], "near100": lambda s: 36 - near[s]}[k_of]
    for strata in (1, 4):  # one pooled cell, or a Sum over four sizes of 9 instances
        per_seed = {s: ({"all": (36, ks(s))} if strata == 1 else
                        {z: (9, min(9, max(0, ks(s) - 9 * z))) for z in range(4)}) for s in range(seeds)}
        st = intervals.rate_interval(per_seed)
        assert 0.0 <= st["low"] <= st["mean"] <= st["high"] <= 1.0, (k_of, seeds, strata, st)
        if k_of == "zero":
            assert st["low"] == 0.0 and st["high"] > 0.0  # no success seen: still not "certainly 0"
        if k_of == "one":
            assert st["high"] == 1.0 and st["low"] < 1.0
    if seeds == 3 and k_of == "near0":
        assert stats.mean_ci([near[s] / 36 for s in range(3)])["low"] < 0  # what Student-t did


def test_gap_and_failure_intervals_stay_inside_bounds_end_to_end(tmp_path):
    every = {3: [True] * 6, 4: [True] * 6}
    none = {3: [False] * 6, 4: [False] * 6}
    verdicts = {}
    for s in range(3):
        verdicts[("all", s)] = write_verdicts(tmp_path / f"all-s{s}", rows_from(every))
        verdicts[("none", s)] = write_verdicts(tmp_path / f"none-s{s}", rows_from(none))
    table = stats.summarize(verdicts, ["all", "none"], "none")
    for r in tables.table_rows(table):
        if r["mean"] is not None:
            assert 0.0 <= r["ci95_low"] <= r["mean"] <= r["ci95_high"] <= 1.0, r
        if r["gap_mean"] is not None:
            assert -1.0 <= r["gap_ci95_low"] <= r["gap_mean"] <= r["gap_ci95_high"] <= 1.0, r
    gap = table["per_size"]["all"]["agents_3"]["valid"]["sum"]["gap"]
    assert gap["mean"] == 1.0 and gap["high"] == 1.0
    for arm in ("all", "none"):
        for kind in table["failures"]["kinds"]:
            st = table["failures"]["rows"][arm][kind]
            assert 0.0 <= st["low"] <= st["mean"] <= st["high"] <= 1.0
    # the plot's error bars never cross 0 or 100
    means, (below, above) = error_bars([table["rows"][a]["all"]["valid"] for a in ("all", "none")])
    assert all(0.0 <= m - b and m + a <= 100.0 for m, b, a in zip(means, below, above, strict=True))
    md = tables.table_markdown(table, title="t", command=None)
    assert "±" not in md and "-0.0 [" not in md


def test_intervals_are_reproducible_byte_for_byte():
    per_seed = {0: {"a": (36, 4), "b": (20, 9)}, 1: {"a": (36, 10), "b": (20, 2)}, 2: {"a": (36, 1)}}
    assert intervals.rate_interval(per_seed) == intervals.rate_interval(per_seed)


# --------------------------------------------------------------------------- gaps paired by seed


def test_gap_is_paired_by_seed_and_instance():
    """Seeds differ a lot (10 %, 50 %, 90 % valid); the arm solves the baseline's instances plus 5 more in
    every seed. Paired, the gap is +5 points with an interval above 0; drawing the arm's and the baseline's
    seeds (or instances) independently would bury it in the seed-to-seed spread."""
    base, arm = {}, {}
    for s, k in enumerate((10, 50, 90)):
        ids = [f"i{j}" for j in range(100)]
        base[s] = {"all": [(i, j < k) for j, i in enumerate(ids)]}
        arm[s] = {"all": [(i, j < k + 5) for j, i in enumerate(ids)]}
    gap = intervals.gap_interval(arm, base)
    assert gap["mean"] == pytest.approx(0.05) and gap["paired_instances"]
    assert 0.0 < gap["low"] <= 0.05 <= gap["high"] < 0.15
    # the unpaired reading of the same numbers: the arm's seed rates against the baseline's, independently
    unpaired = intervals.rate_interval({s: {"all": (100, k + 5)} for s, k in enumerate((10, 50, 90))})
    assert unpaired["low"] < 0.5 - 0.3 and unpaired["high"] > 0.5 + 0.3  # the seed spread, far wider than 5 points
    # other instances per arm: still paired by seed, instances drawn per arm
    other = {s: {"all": [(f"x{j}", ok) for j, (_, ok) in enumerate(v["all"])]} for s, v in arm.items()}
    unpaired_instances = intervals.gap_interval(other, base)
    assert not unpaired_instances["paired_instances"]
    assert unpaired_instances["low"] < 0.0 < gap["low"]  # pairing the instances is what separates the arms


def test_gap_in_the_tables_uses_only_seeds_both_arms_ran(tmp_path):
    verdicts = {("b", s): write_verdicts(tmp_path / f"b-s{s}", rows_from({3: [j < 2 * s for j in range(6)]}))
                for s in (0, 1, 2)}
    verdicts[("a", 1)] = write_verdicts(tmp_path / "a-s1", rows_from({3: [j < 3 for j in range(6)]}))
    table = stats.summarize(verdicts, ["a", "b"], "b")
    gap = table["per_size"]["a"]["agents_3"]["valid"]["sum"]["gap"]
    assert gap["n"] == 1 and gap["mean"] == pytest.approx(3 / 6 - 2 / 6) and gap["per_seed"] == pytest.approx({"1": 1 / 6})


# --------------------------------------------------------------------------- the optimality criterion


def test_optimality_criterion_per_row_and_in_every_table(tmp_path):
    soc_only = row("soc", 3, True, cost=6, optimal_cost=6, optimal_soc=6, makespan=4, optimal_makespan=3)
    mk_only = row("mk", 3, True, cost=7, optimal_cost=6, optimal_soc=6, makespan=3, optimal_makespan=3)
    invalid = row("bad", 3, False, cost=6, optimal_cost=6, optimal_soc=6, makespan=3, optimal_makespan=3)
    assert stats.is_optimal(soc_only, "soc") and not stats.is_optimal(soc_only, "makespan")
    assert stats.is_optimal(mk_only, "makespan") and not stats.is_optimal(mk_only, "soc")
    assert not stats.is_optimal(invalid, "soc") and not stats.is_optimal(invalid, "makespan")
    old = row("old", 3, True, cost=6, optimal_cost=6)  # committed verdicts today: no makespan fields
    assert stats.is_optimal(old, "soc")
    with pytest.raises(ValueError, match="no makespan fields"):
        stats.is_optimal(old, "makespan")
    assert stats.default_criterion([soc_only, mk_only]) == "makespan"
    assert stats.default_criterion([soc_only, old]) == "soc"

    folder = write_verdicts(tmp_path / "x-s0", [soc_only, mk_only, invalid])
    for crit, name in (("makespan", "makespan"), ("soc", "sum of costs")):
        table = stats.summarize({("x", 0): folder}, ["x"], None, criterion=crit)
        assert table["criterion"] == crit
        assert table["rows"]["x"]["all"]["optimal"]["mean"] == pytest.approx(1 / 3)
        out = tmp_path / f"out-{crit}"
        tables.write_tables(table, out, title="t", command=None)
        md = (out / "table.md").read_text()
        assert f"Optimality criterion: **{name}**" in md
        captions = [ln for ln in md.splitlines() if ln.startswith("**") and "optimal %" in ln]
        assert len(captions) == 3 and all(f"optimal: {name}" in c for c in captions)
        assert json.loads((out / "table.json").read_text())["criterion"] == crit
        assert {r["criterion"] for r in csv.DictReader(open(out / "table.csv"))} == {crit}
    assert stats.summarize({("x", 0): folder}, ["x"], None)["criterion"] == "makespan"  # the default
    old_folder = write_verdicts(tmp_path / "y-s0", [old])
    assert stats.summarize({("y", 0): old_folder}, ["y"], None)["criterion"] == "soc"
    with pytest.raises(ValueError, match="makespan"):
        stats.summarize({("y", 0): old_folder}, ["y"], None, criterion="makespan")


# --------------------------------------------------------------------------- published rows


def test_published_rows_are_the_papers_and_shown_only_where_a_reader_compares(tmp_path):
    for run in ("self-engineer V6", "fixed random config"):
        per = published.PER_SIZE_VALID[run][3]
        assert sum(per.values()) / len(per) == pytest.approx(published.HEADLINE[run][3][0], abs=0.005)
    test = {("self", 0): write_verdicts(tmp_path / "t", rows_from({3: [True, False]}), final_split="test")}
    mini = {("self", 0): write_verdicts(tmp_path / "m", rows_from({3: [True, False]}), final_split="test-mini")}
    assert loop.show_published(test, None) and not loop.show_published(mini, None)
    assert loop.show_published(mini, True) and not loop.show_published(test, False)

    table = stats.summarize(test, ["self"], None)
    md = tables.table_markdown(table, title="t", command=None, published=published.RUNS["engineers"])
    v6 = next(ln for ln in md.splitlines() if ln.startswith("| self-engineer V6 (published) |"))
    assert v6.startswith("| self-engineer V6 (published) | – | 68.67 / – | 64.67 / – |")
    assert v6.endswith("| 51.67 | 31.67 |")
    assert "| base model as engineer (published) | – | – / – |" in md and published.CAPTION in md
    assert "| context V6 (published) | – | 45.20 / – | 35.70 / – | 27.30 / – |" in md  # the wait-subset table
    plain = tables.table_markdown(table, title="t", command=None)
    assert "(published)" not in plain and published.CAPTION not in plain


# --------------------------------------------------------------------------- committed tables stay true


def _configs_by_out() -> dict[Path, Path]:
    out = {}
    for cfg in sorted((ROOT / "evals" / "configs").glob("*.yaml")):
        raw = yaml.safe_load(cfg.read_text()) or {}
        if raw.get("out"):
            out[repo_path(raw["out"]).resolve()] = cfg
    return out


def _table_folders() -> list[str]:
    return sorted(d.name for d in RESULTS.iterdir() if d.is_dir() and (d / "table.md").is_file())


def test_every_results_folder_is_rebuilt_or_excluded_with_a_reason():
    configs = _configs_by_out()
    for d in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        if d.name in EXCLUDED:
            assert not (d / "table.md").exists(), f"{d.name} has a table now: rebuild it instead of excluding it"
        else:
            assert (d / "table.md").is_file(), f"{d.name}: no table.md and no reason in EXCLUDED"
            assert d.resolve() in configs, f"{d.name}: no config in evals/configs/ has it as out"


@pytest.mark.parametrize("name", _table_folders())
def test_committed_tables_are_rebuilt_from_their_verdicts_byte_for_byte(name, tmp_path):
    """The committed folder's inputs (its packed answers, `answers.tar.xz`, and timings) copied elsewhere, its
    tables rebuilt through the script's own `--tables-only` path: every table file is the same, byte for byte."""
    folder = RESULTS / name
    cfg = _configs_by_out()[folder.resolve()]
    module = config_command(cfg).split()[2]  # "python -m evals.<script> --config ..."
    out = tmp_path / name
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(*OUTPUTS, "metrics.json", "*.png"))
    committed = json.loads((folder / "table.json").read_text())
    assert "tables_built_on" not in committed, "a table names the machine it was built on: it would not rebuild"
    assert (out / "answers.tar.xz").is_file() and not (out / "verdicts").exists(), "answers are not packed"
    assert importlib.import_module(module).main(["--config", str(cfg), "--tables-only", "--out", str(out)]) == 0
    compared = [f for f in OUTPUTS if (folder / f).is_file()]
    compared += [f"cpu/{f}" for f in OUTPUTS if (folder / "cpu" / f).is_file()]  # the CPU-scale held-out table
    compared += [str(p.relative_to(folder)) for p in sorted(folder.glob("*/metrics.json"))]
    assert "table.md" in compared and "table.json" in compared
    for f in compared:
        assert (out / f).is_file(), f"{name}/{f} was not rebuilt"
        assert (out / f).read_bytes() == (folder / f).read_bytes(), (
            f"{name}/{f} differs from what its verdicts give: rebuild it with `{config_command(cfg)} --tables-only`")
    assert not [f for f in OUTPUTS if (out / f).is_file() and not (folder / f).is_file()], "a table is not committed"


def test_published_rows_beside_a_sum_of_costs_table_say_the_optimal_columns_do_not_compare(tmp_path):
    folder = write_verdicts(tmp_path / "x-s0", [row("a", 3, True, cost=6, optimal_cost=6)], final_split="test")
    md = tables.table_markdown(stats.summarize({("x", 0): folder}, ["x"], None), title="t", command=None,
                               published=published.RUNS["engineers"])
    assert "Our optimal % here is by sum of costs, the paper's by makespan" in md
    mk = write_verdicts(tmp_path / "y-s0", [row("a", 3, True, cost=6, optimal_cost=6, makespan=3, optimal_makespan=3)])
    md = tables.table_markdown(stats.summarize({("y", 0): mk}, ["y"], None), title="t", command=None,
                               published=published.RUNS["engineers"])
    assert "Optimality criterion: **makespan**" in md and "the paper's by makespan" not in md


def test_cpu_scale_held_out_table_is_written_beside_the_benchmark_table(tmp_path):
    """Pairs with a `final_cpu/eval.jsonl` (settings `final_cpu_split`) get a second table in `cpu/`, from those
    verdicts only, without the paper's rows; the benchmark's own table is unchanged beside it."""
    from evals.config import LoopConfig

    verdicts = {}
    for arm, ok in (("fixed", [True, False, False]), ("self", [True, True, False])):
        folder = write_verdicts(tmp_path / "v" / f"{arm}-s0", [row(f"{arm}-t", 5, False)], final_split="test")
        (folder / "final_cpu").mkdir()
        cpu = [row(f"c{j}", 3, v, agents=2, makespan=2, optimal_makespan=2, cost=3, optimal_cost=3)
               for j, v in enumerate(ok)]
        (folder / "final_cpu" / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cpu))
        (folder / "settings.json").write_text(json.dumps({"final_split": "test", "final_cpu_split": "test-cpu"}))
        verdicts[(arm, 0)] = folder
    out = tmp_path / "out"
    cfg = LoopConfig(seeds=[0], out=out, baseline="fixed")
    loop.write_loop_tables(verdicts, ["fixed", "self"], cfg, out, title="T", command=None, arm_header="engineer",
                           notes=[], extra={})
    main_md, cpu_md = (out / "table.md").read_text(), (out / "cpu" / "table.md").read_text()
    assert "CPU-scale held-out table (test-cpu)" in cpu_md and "(published)" not in cpu_md
    assert "| self | 1 | 66.7 / 66.7 |" in cpu_md and "| fixed | 1 | 33.3 / 33.3 |" in cpu_md
    assert "2 agents" in cpu_md and "2 agents" not in main_md
    # without final_cpu verdicts, no cpu/ table
    out2 = tmp_path / "out2"
    only_main = {k: write_verdicts(tmp_path / "w" / f"{k[0]}-s0", [row("t", 5, False)]) for k in verdicts}
    loop.write_loop_tables(only_main, ["fixed", "self"], cfg, out2, title="T", command=None, arm_header="engineer",
                           notes=[], extra={})
    assert (out2 / "table.md").is_file() and not (out2 / "cpu").exists()


def test_tables_only_in_place_leaves_every_committed_file_as_it_was():
    """`--tables-only` on a committed folder itself (no --out): no file changes by a byte, none is added, and the
    packed answers stay packed (nothing machine- or time-specific goes into a table)."""
    from evals import compare_engineers

    folder = RESULTS / "compare_smoke"
    before = {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    cfg = ROOT / "evals" / "configs" / "compare_smoke.yaml"
    assert compare_engineers.main(["--config", str(cfg), "--tables-only"]) == 0
    after = {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    assert sorted(after) == sorted(before)
    changed = [str(f) for f in before if after[f] != before[f]]
    assert not changed, f"--tables-only rewrote {changed}"


# --------------------------------------------------------------------------- mean@k beside the greedy rates


def test_sampled_answers_give_a_mean_at_k_table_pooled_over_seeds_with_the_gap(tmp_path):
    """Each question's share of right samples, averaged over questions, then seeds; the gap paired by question."""
    shares = {("a", 0): [1, 0.5, 0.5, 0], ("a", 1): [1, 1, 0.5, 0], ("b", 0): [0.5, 0, 0, 0], ("b", 1): [0.5, 0.5, 0, 0]}
    verdicts = {}
    for (arm, seed), ss in shares.items():
        folder = write_verdicts(tmp_path / f"{arm}-s{seed}", rows_from({3: [True, False, False, False]}))
        (folder / "final" / "eval_sampled.jsonl").write_text("".join(
            json.dumps({"id": f"a3-s3-{j}", "sample": i, "valid": i < 2 * s}) + "\n"
            for j, s in enumerate(ss) for i in range(2)))
        (folder / "final" / "metrics.json").write_text(json.dumps({"final/sample_temperature": 0.7}))
        verdicts[(arm, seed)] = folder
    table = stats.summarize(verdicts, ["a", "b"], "b")
    smp = table["sampled"]
    assert smp["k"] == [2] and smp["temperature"] == [0.7]
    assert smp["rows"]["a"]["mean"] == pytest.approx((0.5 + 0.625) / 2)
    assert smp["rows"]["b"]["mean"] == pytest.approx((0.125 + 0.25) / 2)
    gap = smp["rows"]["a"]["gap"]
    assert gap["mean"] == pytest.approx(0.5625 - 0.1875) and gap["paired_instances"] and gap["low"] < gap["mean"]
    assert smp["rows"]["a"]["low"] < smp["rows"]["a"]["mean"] < smp["rows"]["a"]["high"]  # the bootstrap, not 0/1
    tables.write_tables(table, tmp_path / "out", title="t", command=None)
    md = (tmp_path / "out" / "table.md").read_text()
    assert "**Sampled valid % (mean@2 at temperature 0.7)**" in md and "| a | 2 | 56.2 [" in md
    assert "| gap to b (points) |" in md
    rows = list(csv.DictReader(open(tmp_path / "out" / "table.csv")))
    assert [float(r["mean"]) for r in rows if r["metric"] == "sampled_valid" and r["arm"] == "b"] == [0.1875]
    for folder in verdicts.values():  # no sampled answers: no table, as before
        (folder / "final" / "eval_sampled.jsonl").unlink()
    assert "sampled" not in stats.summarize(verdicts, ["a", "b"], "b")
