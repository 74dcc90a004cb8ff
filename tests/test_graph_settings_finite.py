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
