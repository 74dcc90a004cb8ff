"""Every float setting, of the run and of training, refuses inf and NaN in one line, whatever the spelling
(`inf`, `-inf`, `nan`, `1e400`, which reads as inf): a run on such a value dies after its first step, and a
resume keeps the value (a resume ignores --set), so the run folder could not be saved."""

from __future__ import annotations

import typing

import pytest

from graph import run as gr
from graph.settings import Settings, SettingsError, build_settings
from trainer.config import TrainConfig


def _float_fields(model) -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if ann is float or float in typing.get_args(ann):
            out.append(name)
    return out


FLOATS = [f for f in _float_fields(Settings)] + [f"train.{f}" for f in _float_fields(TrainConfig)]


def test_there_are_float_settings_to_check():
    assert {"engineer_temperature", "train.learning_rate", "train.temperature", "train.beta"} <= set(FLOATS)


@pytest.mark.parametrize("name", FLOATS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "-1e999", "Infinity"])
def test_every_float_setting_refuses_inf_and_nan(name, value):
    with pytest.raises(SettingsError) as info:
        build_settings({name: value}, {"PRESET": "smoke"})
    msg = str(info.value)
    assert "\n" not in msg and f"bad setting {name} " in msg and repr(value) in msg and "finite" in msg, msg


def test_from_the_command_line_and_the_environment(tmp_path, capsys):
    for args, env in ((["--set", "train.learning_rate=1e400"], {}), ([], {"TRAIN__TEMPERATURE": "1e999"})):
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            assert gr.main(["--run-dir", str(tmp_path / "r"), "--preset", "smoke", *args]) == gr.EXIT_BAD_SETTINGS
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Input should be a finite number" in err, err
        assert not (tmp_path / "r").exists()


def test_a_removed_training_lever_loads_off_and_is_refused_on(tmp_path):
    """A settings.json written before a lever's removal, holding it off, still loads (resume, committed grids);
    holding it on, or setting it now, is refused in one line that names it."""
    import json

    from graph.settings import Settings, build_settings

    s = build_settings({}, {"PRESET": "smoke"})
    raw = json.loads(s.model_dump_json())
    raw["train"].update({"sft_mix": 0.0, "localize_credit": False, "select_instances": 0})
    (tmp_path / "old.json").write_text(json.dumps(raw))
    assert Settings.load(tmp_path / "old.json").train == s.train
    raw["train"]["sft_mix"] = 0.5
    (tmp_path / "on.json").write_text(json.dumps(raw))
    with pytest.raises(Exception, match=r"sft_mix=0.5: a setting removed from the trainer .*\(sft_mix=0.0\) still loads"):
        Settings.load(tmp_path / "on.json")
    with pytest.raises(Exception, match=r"sft_mix='1': a setting removed from the trainer"):
        build_settings({"train.sft_mix": "1"}, {})
