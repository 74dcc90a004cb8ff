"""evals.bench.plot_learning: the forest plot of bench_learning's arms, read from their own files."""

import json

import pytest

from evals.bench import plot_learning


def _file(path, gains, interval=(0.011, 0.093), steps=144, sft=300):
    data = {"seeds": [{"seed": i, "gain": g} for i, g in enumerate(gains)],
            "train_config": {"max_steps": steps, "sft_steps": sft}}
    if interval is not None:
        data["gain_interval_bootstrap_95"] = list(interval)
    path.write_text(json.dumps(data))
    return path


def test_a_row_carries_the_files_own_gains_interval_and_stage(tmp_path):
    a = plot_learning.arm(_file(tmp_path / "bench_learning_s59_x.json", [0.06, 0.0667, 0.0333]))
    assert a["gains"] == pytest.approx([6.0, 6.67, 3.33])
    assert a["mean"] == pytest.approx(5.333, abs=1e-3)
    assert a["interval"] == pytest.approx([1.1, 9.3])
    assert a["label"] == "s59_x (144 GRPO steps, 300-step start, 3 seeds, recorded interval)"
    old = plot_learning.arm(_file(tmp_path / "old.json", [0.02], interval=None, steps=None, sft=None))
    assert old["interval"] is None and old["label"] == "old (? GRPO steps, ?-step start, 1 seed)"


def test_the_cli_writes_the_figure_and_prints_every_row_in_order(tmp_path, capsys):
    files = [_file(tmp_path / "bench_learning_a.json", [0.02, -0.01], interval=(-0.03, 0.04)),
             _file(tmp_path / "bench_learning_b.json", [0.05], interval=None)]
    out = tmp_path / "fig" / "gains.png"
    arms = plot_learning.main([str(f) for f in files] + ["--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert [a["label"].split()[0] for a in arms] == ["a", "b"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(" +0.5 [-3.0, +4.0]  a (") and lines[1].startswith(" +5.0  b (")
    assert lines[-1] == f"wrote {out}"


@pytest.mark.parametrize("content, says", [("{not json", "cannot be read as JSON"),
                                           ('{"seeds": []}', "no finished seed"),
                                           ('{"seeds": [{"seed": 0}]}', "no finished seed")])
def test_a_file_that_is_not_an_arm_is_named_in_one_error(tmp_path, capsys, content, says):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(SystemExit) as e:
        plot_learning.main([str(bad), "--out", str(tmp_path / "g.png")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and str(bad) in err and says in err and "bench_learning" in err
    assert not (tmp_path / "g.png").exists()


def test_an_unknown_figure_format_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        plot_learning.main([str(_file(tmp_path / "a.json", [0.01])), "--out", str(tmp_path / "g.jpg")])
    err = capsys.readouterr().err
    assert "--out" in err and "g.jpg" in err and ".png" in err


def test_the_interval_is_recomputed_two_way_from_the_seeds_answers(tmp_path):
    """A file whose seeds carry their per-instance differences gets the two-way interval of those, whatever
    interval it recorded; one without them keeps its own, and its label says so."""
    from evals.intervals import crossed_interval

    diffs = [[1, 0, 0, -1, 1, 0] * 5, [0, 1, 0, 0, 1, -1] * 5]
    path = tmp_path / "bench_learning_x.json"
    path.write_text(json.dumps({"seeds": [{"seed": i, "gain": sum(d) / len(d), "diffs": d} for i, d in enumerate(diffs)],
                                "gain_interval_bootstrap_95": [0.0, 0.01], "train_config": {}}))
    a = plot_learning.arm(path)
    assert a["interval"] == pytest.approx([100 * v for v in crossed_interval(diffs)]) != [0.0, 1.0]
    assert "recorded interval" not in a["label"]
    assert "recorded interval" in plot_learning.arm(_file(tmp_path / "old.json", [0.02]))["label"]


def test_arms_are_read_from_a_results_folders_archive(tmp_path, capsys):
    from evals import packed

    folder = tmp_path / "res"
    folder.mkdir()
    _file(folder / "bench_learning_a.json", [0.02, 0.04])
    _file(folder / "bench_learning_a_seed0.json", [0.02])
    packed.main([str(folder)])
    assert sorted(p.name for p in folder.iterdir()) == ["answers.tar.xz"]
    arms = plot_learning.main([f"{folder}/answers.tar.xz:bench_learning*.json", "--exclude", "_seed",
                               "--out", str(tmp_path / "g.png")])
    assert [a["label"].split()[0] for a in arms] == ["a"] and arms[0]["mean"] == pytest.approx(3.0)
    with pytest.raises(SystemExit):
        plot_learning.main([f"{folder}/answers.tar.xz:nothing*.json", "--out", str(tmp_path / "h.png")])
    assert "no member" in capsys.readouterr().err
