"""A model path that names a Hugging Face hub repository (``Qwen/Qwen3-0.6B``): its local
snapshot directory in huggingface_hub's cache, downloaded there when the machine can.

The driver resolves it once, as it loads the config (``config/load.py``), before any
process starts: the run's config.json and launch plan hold the snapshot directory, so
every role loads the same files and none of them reaches the hub. A path that exists
on disk always wins over an id of the same shape.

The cache is huggingface_hub's: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``; ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set: the
cache only. Both are read when a path is resolved (not when huggingface_hub was imported).
"""

from __future__ import annotations

import os
import re

from asyncflow.core.schema import ConfigError

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
"""``org/name``, as the hub spells a repository id."""

DOWNLOADED = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")
"""What a download fetches: config, safetensors weights, tokenizer and chat template
(not a repository's other weight formats: GGUF, ONNX, ``pytorch_model.bin``)."""
NOT_DOWNLOADED = ("original/*", "consolidated*.safetensors")
"""Copies of the weights in another layout than transformers' (Llama's ``original/``,
Mistral's ``consolidated.safetensors``)."""

_TRUE = {"1", "ON", "YES", "TRUE"}


def is_hub_id(value: str) -> bool:
    """``value`` has the shape of a hub repository id (``org/name``, no ``..``)."""
    return bool(HUB_ID.fullmatch(value)) and ".." not in value


def cache_dir() -> str:
    """huggingface_hub's cache directory, from the environment as it is now."""
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not hub:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        hub = os.path.join(os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface"), "hub")
    return os.path.expandvars(os.path.expanduser(hub))


def offline() -> str:
    """The variable that sets huggingface_hub offline now (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE`` true); empty when online."""
    return next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(name, "").upper() in _TRUE), "")


def resolve(key: str, repo_id: str) -> str:
    """The local snapshot directory of ``repo_id`` (its default branch): from the cache,
    else downloaded into it (online); a ConfigError naming ``key``, the id and the
    command that fetches it otherwise."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir()
    fetch = f"`hf download {repo_id}` (with the same HF_HOME / HF_HUB_CACHE)"
    try:
        return huggingface_hub.snapshot_download(repo_id, cache_dir=cache, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    flag = offline()
    if flag:
        raise ConfigError(
            f"{key} = {repo_id!r}: no such local directory, and the Hugging Face hub model {repo_id} is not in the "
            f"cache ({cache}) while {flag} is set; fetch it where the machine is online with {fetch}, or unset "
            f"{flag} to download it now, or give a local directory"
        )
    print(f"downloading {repo_id} from the Hugging Face hub into {cache} ...", flush=True)
    try:
        path = huggingface_hub.snapshot_download(
            repo_id, cache_dir=cache, allow_patterns=list(DOWNLOADED), ignore_patterns=list(NOT_DOWNLOADED)
        )
    except Exception as exc:  # no network, no such repository, a gated one without a token: all say the same
        raise ConfigError(
            f"{key} = {repo_id!r}: no such local directory, and downloading the Hugging Face hub model {repo_id} into "
            f"{cache} failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); check the id, log in "
            f"for a gated model (`hf auth login`), or fetch it with {fetch}, or give a local directory"
        ) from None
    if not any(name.endswith(".safetensors") for _, _, files in os.walk(path) for name in files):
        raise ConfigError(
            f"{key} = {repo_id!r}: the Hugging Face hub model {repo_id} has no safetensors weights (only another format); "
            f"fetch it whole with {fetch} and give that snapshot directory, or convert it to safetensors"
        )
    return str(path)
