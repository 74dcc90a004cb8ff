"""The policy server's weights dtype: bf16 where the CPU multiplies bf16 in hardware (AMX or AVX-512
BF16), float32 on other CPUs, vLLM's own on
a GPU; resolved once in Settings so settings.json says what the run used, and carried to every server the run
starts (evaluation, the self/base engineer, the kept server)."""

from __future__ import annotations

import pytest

import llm_backends.policy as lp
import llm_backends.vllm_server as vs
from graph.settings import SettingsError, build_settings
from llm_backends.vllm_server import VLLMServer, cpu_has_bf16, resolve_serving_dtype

XEON = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n"  # Zen 4: AVX-512 BF16, no AMX
OLD = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n"  # AVX-512 without its BF16 extension
SPOOF = "processor\t: 0\nmodel name\t: amx_bf16 avx512_bf16 lookalike\nflags\t\t: fpu avx2\n"


def test_bf16_hardware_is_read_from_the_cpu_flags(tmp_path):
    for name, text in {"xeon": XEON, "epyc": EPYC, "old": OLD, "spoof": SPOOF}.items():
        (tmp_path / name).write_text(text)
    assert cpu_has_bf16(tmp_path / "xeon") and cpu_has_bf16(tmp_path / "epyc")
    assert not cpu_has_bf16(tmp_path / "old")
    assert not cpu_has_bf16(tmp_path / "spoof")  # only the flags line counts
    assert not cpu_has_bf16(tmp_path / "missing")  # unreadable: no bf16 hardware assumed


@pytest.mark.parametrize("cpu,bf16,want", [(True, True, "bfloat16"), (True, False, "float32"), (False, True, "auto")])
def test_auto_resolves_by_machine(cpu, bf16, want):
    assert resolve_serving_dtype("auto", cpu=cpu, bf16=bf16) == want
    assert resolve_serving_dtype("float32", cpu=cpu, bf16=bf16) == "float32"  # an explicit choice is kept


def test_a_bad_dtype_is_one_clear_error():
    with pytest.raises(ValueError, match=r"serving dtype 'fp8': allowed: auto, float32, bfloat16"):
        resolve_serving_dtype("fp8")
    with pytest.raises(SettingsError, match=r"policy_dtype.*'fp8'"):
        build_settings({"policy_dtype": "fp8"}, {})


@pytest.mark.parametrize("bf16", [True, False])
def test_settings_record_the_dtype_the_run_uses(monkeypatch, bf16):
    monkeypatch.setattr(vs, "is_cpu_build", lambda: True)
    monkeypatch.setattr(vs, "cpu_has_bf16", lambda cpuinfo="/proc/cpuinfo": bf16)
    assert build_settings({"preset": "cpu"}, {}).policy_dtype == ("bfloat16" if bf16 else "float32")
    assert build_settings({"preset": "smoke"}, {}).policy_dtype == "float32"  # CI: the same answers on any CPU
    assert build_settings({"preset": "cpu", "policy_dtype": "float32"}, {}).policy_dtype == "float32"
    assert build_settings({"preset": "cpu"}, {"POLICY_DTYPE": "float32"}).policy_dtype == "float32"


def test_on_a_gpu_build_vllm_chooses(monkeypatch):
    monkeypatch.setattr(vs, "is_cpu_build", lambda: False)
    assert build_settings({"preset": "paper"}, {}).policy_dtype == "auto"


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_the_server_command_line_carries_the_dtype(tmp_path, monkeypatch):
    monkeypatch.setattr(vs, "is_cpu_build", lambda: True)
    monkeypatch.setattr(vs, "cpu_has_bf16", lambda cpuinfo="/proc/cpuinfo": True)
    kw = {"log_path": tmp_path / "v.log", "port": 1}
    assert _flag(VLLMServer(tmp_path, **kw).command(), "--dtype") == "float32"  # no choice: as before
    assert _flag(VLLMServer(tmp_path, dtype="auto", **kw).command(), "--dtype") == "bfloat16"
    assert _flag(VLLMServer(tmp_path, dtype="bfloat16", enable_lora=True, **kw).command(), "--dtype") == "bfloat16"


def test_open_policy_and_the_kept_server_use_the_settings_dtype(tmp_path, monkeypatch):
    """Every server the run starts gets the dtype; a kept server in another dtype is replaced, not reused."""
    started = []

    class FakeServer:
        def __init__(self, model, *, log_path, dtype=None, **kw):
            self.model_path, self.dtype, self.running = model, dtype and vs.resolve_serving_dtype(dtype), True
            self.enable_lora, self.max_lora_rank = kw.get("enable_lora", False), kw.get("max_lora_rank", 16)
            self.model_name = "kept"
            started.append(dtype)

        def start(self):
            return self

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.running = False

        def stop(self):
            self.running = False

        def client(self, **kw):
            return type("Chat", (), {"close": lambda self: None})()

        def note(self, text):
            pass

    monkeypatch.setattr(vs, "VLLMServer", FakeServer)
    monkeypatch.setattr(vs, "is_cpu_build", lambda: True)
    monkeypatch.setattr(vs, "cpu_has_bf16", lambda cpuinfo="/proc/cpuinfo": True)
    monkeypatch.setattr(lp, "resolve_model", lambda w: tmp_path)
    monkeypatch.setattr(lp, "_arch", lambda path: ("same",))
    monkeypatch.setattr(lp, "_point_to", lambda *a: None)
    (tmp_path / "config.json").write_text("{}")
    with lp.open_policy(str(tmp_path), "vllm", tmp_path, dtype="bfloat16", keep_server=False):
        pass
    for dtype in ("bfloat16", "bfloat16", "float32", "auto", "auto", "bfloat16"):
        with lp.open_policy(str(tmp_path), "vllm", tmp_path, dtype=dtype, keep_server=True):
            pass
    lp._KEPT.clear()
    # one plain server; then kept: reused, replaced by float32, replaced by "auto" (bf16 here), which is then
    # reused for "auto" and for "bfloat16" alike: the kept server is compared by the dtype it resolved to
    assert started == ["bfloat16", "bfloat16", "float32", "auto"]
