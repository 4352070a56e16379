"""Where a model comes from: the embedded one, a local folder, or a hub id (`org/name`) fetched
with huggingface_hub into its usual cache, as vLLM does. Offline (HF_HUB_OFFLINE=1) a hub id
is read from that cache only.

huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HUB_CACHE once, at its import; they
are read here at each call instead, so a process that changes them (a test) is obeyed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from flashlane.config import DEFAULT_MODEL

# what a checkpoint needs: config, weights, tokenizer, generation config, chat template
PATTERNS = ["*.json", "*.safetensors", "*.jinja"]
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
TRUE = {"1", "true", "yes", "on"}


class ModelNotFound(ValueError):
    """Neither a folder nor a hub id we can fetch; the message says which and why."""


def resolve_model(model: str | None) -> tuple[Path, str]:
    """(the checkpoint's folder, the name to serve it as) for `--model` / `LLM(model=...)`."""
    if model is None:
        return DEFAULT_MODEL, DEFAULT_MODEL.name
    path = Path(model).expanduser()
    if path.exists():
        return path, path.name
    if not HUB_ID.match(model):
        raise ModelNotFound(f"{model}: no such folder (nor a hub id like org/name)")
    return fetch(model), model


def is_offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def fetch(repo_id: str) -> Path:
    """The snapshot folder of `repo_id`, downloaded if it is not cached (online)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise ModelNotFound(
            f"{repo_id}: not a folder here; fetching hub ids needs huggingface_hub "
            "(pip install huggingface_hub)"
        ) from None
    offline = is_offline()
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=PATTERNS,
            cache_dir=_cache_dir(),
            local_files_only=offline,
            endpoint=endpoint,
        )
    except GatedRepoError:
        raise ModelNotFound(
            f"{repo_id}: gated on the hub; log in (HF_TOKEN) and accept its terms first"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFound(
            f"{repo_id}: no such model on the hub "
            f"({endpoint or 'huggingface.co'}), nor a folder here"
        ) from None
    except LocalEntryNotFoundError:
        why = (
            "HF_HUB_OFFLINE is set and it is not in the cache"
            if offline
            else "the hub cannot be reached and it is not in the cache"
        )
        raise ModelNotFound(
            f"{repo_id}: {why} ({_cache_dir() or '~/.cache/huggingface/hub'})"
        ) from None
    except HfHubHTTPError as err:
        raise ModelNotFound(f"{repo_id}: the hub answered {err}") from None
    return Path(folder)


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None
