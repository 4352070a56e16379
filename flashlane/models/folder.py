"""What a checkpoint folder holds beside its weights: the tokenizer, the generation
defaults and the chat template (transformers' file names), and a --chat-template given as a
file or as the template itself."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["chat_template", "generation_defaults", "read_template", "tokenizer"]


def tokenizer(path: Path):
    """The folder's tokenizer.json (tokenizers' Tokenizer), None without one."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    return Tokenizer.from_file(str(file)) if file.exists() else None


def _json(file: Path) -> dict:
    return json.loads(file.read_text()) if file.exists() else {}


def generation_defaults(path: Path) -> dict:
    """generation_config.json's values ({} without one)."""
    return _json(path / "generation_config.json")


def chat_template(path: Path) -> str | None:
    """chat_template.jinja, else tokenizer_config.json's chat_template, else None."""
    if (path / "chat_template.jinja").exists():
        return (path / "chat_template.jinja").read_text()
    return _json(path / "tokenizer_config.json").get("chat_template")


def read_template(given: str) -> str:
    """--chat-template: a file's text, or the template itself (vLLM takes either)."""
    file = Path(given)
    if "{" not in given and not file.is_file():
        raise ValueError(f"--chat-template {given!r}: no such file (nor a jinja template)")
    return file.read_text() if "{" not in given else given
