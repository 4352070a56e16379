"""How one engine option is spelled outside Python: the `Flag` record an EngineConfig field
carries in its metadata (help, aliases, type, environment variables), from which `flags.py`
builds the command line and `EngineConfig.resolve` reads the environment, and vLLM's
keyword names for LLM(...). A field without a flag is marked `internal`, with the reason, so
that a new field cannot be left out."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import Field, dataclass, field
from typing import Any

TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class Flag:
    """The flag is --field-name, or --no-field-name for a switch (a bool field) that is on by
    default; a switch's variables then say NO_ too: set true, they turn it off."""

    help: str  # argparse's help text (a % doubled), naming the default
    aliases: tuple[str, ...] = ()  # vLLM's and llama.cpp's spellings, after ours
    type: Callable[[str], Any] | None = None  # argparse's and the environment's; None: text
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    env: tuple[str, ...] = ()  # set it when no flag or kwarg does; the first one set wins
    serve_only: bool = False  # `generate` has a sampling flag of the same name
    dest: str | None = None  # argparse's attribute where the flag's own would clash


def option(default: Any, help: str, **flag: Any) -> Any:
    """An EngineConfig field with a flag (Flag's keywords)."""
    return field(default=default, metadata={"flag": Flag(help, **flag)})


def internal(default: Any, why: str) -> Any:
    """An EngineConfig field with no flag, set by LLM / AsyncEngine keywords only."""
    return field(default=default, metadata={"internal": why})


def flag_of(f: Field) -> Flag | None:
    return f.metadata.get("flag")


def in_choices(f: Field, value: Any) -> tuple[bool, str, str]:
    """(ok, name, why) for field f's value against its flag's choices (None: unset, allowed
    where it is the default)."""
    choices = (flag_of(f) and flag_of(f).choices) or ()
    unset = f.default is None
    ok = not choices or value in choices or (unset and value is None)
    names = " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)
    return ok, f.name, f"must be {names}{' or unset' if unset else ''}, got {value!r}"


def is_switch(f: Field) -> bool:
    return isinstance(f.default, bool)


def flag_name(f: Field) -> str:
    """--field-name; --no-field-name for a switch on by default."""
    name = f.name.replace("_", "-")
    return f"--no-{name}" if is_switch(f) and f.default else f"--{name}"


def from_env(f: Field, var: str, raw: str) -> Any:
    """Variable `var`'s text as field f's value: a switch on by default is turned off by its
    NO_ variable set true; numbers as the flag's type reads them; else the text."""
    if is_switch(f):
        on = raw.strip().lower() in TRUE
        return not on if f.default else on
    kind = flag_of(f).type
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r} is not a number") from None
    return raw


def environment_values(
    fields: Iterable[Field], given: Mapping[str, Any], environ: Mapping[str, str]
) -> dict[str, Any]:
    """The values the environment sets for the fields not `given` (the first of a flag's
    variables that is set and not empty wins)."""
    values = {}
    for f in fields:
        if f.name in given or flag_of(f) is None:
            continue
        for var in flag_of(f).env:
            raw = environ.get(var)
            if raw is None or raw == "":
                continue
            values[f.name] = from_env(f, var, raw)
            break
    return values


# vLLM's LLM(...) keyword -> ours
VLLM_NAMES = {"max_model_len": "context", "max_num_seqs": "parallel"}


def our_names(options: dict[str, Any]) -> dict[str, Any]:
    """LLM(...) keywords with vLLM's names (max_model_len, max_num_seqs,
    enable_prefix_caching) given as ours; a name given both ways must agree."""
    out = dict(options)
    for theirs, name in VLLM_NAMES.items():
        if theirs not in out:
            continue
        value = out.pop(theirs)
        if out.get(name) is not None and value is not None and out[name] != value:
            raise TypeError(f"{theirs}={value!r} and {name}={out[name]!r} disagree: give one")
        if value is not None:
            out[name] = value
    if "enable_prefix_caching" in out:
        on = out.pop("enable_prefix_caching")
        if on is False:
            if out.get("prompt_cache_gb") not in (None, 0):
                raise TypeError("enable_prefix_caching=False and prompt_cache_gb disagree")
            out["prompt_cache_gb"] = 0.0
    return out


def json_object(text: str) -> dict:
    """A flag's JSON object (argparse prints the error as it is)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value
