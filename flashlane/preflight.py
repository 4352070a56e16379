"""What `flashlane serve` and `generate` check before anything heavy loads (and before the
server binds its port): the model can be found (a folder, or a hub id fetched), its config
is an architecture we serve, it holds weights, the device exists, and a tokenizer is there
when text must be encoded. Each failure is one ValueError whose message is the one line the
user sees."""

from __future__ import annotations

from pathlib import Path

from flashlane.config import EngineConfig
from flashlane.models.config import ModelConfig
from flashlane.models.hub import resolve_model
from flashlane.models.loader import checkpoint_files


def preflight(model: str | None, *, device: str | None, needs_tokenizer: bool) -> tuple[Path, str]:
    """(the checkpoint's folder, its name: the hub id or the folder's name)."""
    folder, name = resolve_model(model)
    ModelConfig.from_hf(folder)
    checkpoint_files(folder)
    EngineConfig(device=device or "auto").resolved_device()
    if needs_tokenizer and not (folder / "tokenizer.json").exists():
        raise ValueError(
            f"{folder}: no tokenizer.json, and text needs one; copy the tokenizer files of the "
            "model it was trained from into the folder (or send token ids: --prompt-ids, "
            "LLM.generate([ids]))"
        )
    return folder, name
