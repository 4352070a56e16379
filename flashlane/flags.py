"""The engine flags of `flashlane serve` and `generate`: our names, vLLM's and llama.cpp's as
aliases, every one with its default in its help, and a parser that names the nearest flag when
it meets one it does not know (no abbreviations: `--mod x` is an error, not `--model x`)."""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import fields
from typing import NoReturn

from flashlane.config import EngineConfig
from flashlane.options import flag_name, flag_of, is_switch


class FlagParser(argparse.ArgumentParser):
    """argparse without prefix matching; an unknown flag gets "did you mean --x?"."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unknown_message(extras, self._chosen(parsed)))
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The subcommand's parser (its flags are the ones to suggest), else this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if chosen is not None:
                    return chosen
        return self

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def unknown_message(extras: list[str], parser: argparse.ArgumentParser) -> str:
    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    notes: list[str] = []
    after_flag = False
    for arg in extras:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("-"):
            if not after_flag:  # else it is the unknown flag's value
                notes.append(f"unexpected argument {arg!r}")
            after_flag = False
            continue
        after_flag = "=" not in arg
        near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else f"; see `{parser.prog} --help`"
        notes.append(f"unknown flag {flag}{hint}")
    return "; ".join(notes)


def engine_flags(p: argparse.ArgumentParser, *, serve: bool = False) -> None:
    """The engine options of DESIGN.md section 8, one flag per EngineConfig field, named,
    typed and documented by the field's metadata (`options.Flag`); with serve, also the
    flags only `serve` has. Unset flags fall back to the environment, then to the field's
    default."""
    for f in fields(EngineConfig):
        flag = flag_of(f)
        if flag is None or (flag.serve_only and not serve):
            continue
        kwargs: dict = dict(help=flag.help)
        if is_switch(f):
            kwargs.update(action="store_true", default=None)
        else:
            kwargs.update(default=None, type=flag.type, metavar=flag.metavar, choices=flag.choices)
        if flag.dest is not None:
            kwargs.update(dest=flag.dest)
        p.add_argument(flag_name(f), *flag.aliases, **kwargs)
        if f.name == "prompt_cache_gb":
            _prefix_caching_flag(p)


def _prefix_caching_flag(p: argparse.ArgumentParser) -> None:
    """vLLM's switch for the prompt cache: not a field, a spelling of prompt_cache_gb 0."""
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's name for the prompt cache; --no-enable-prefix-"
        "caching is --prompt-cache-gb 0 (default: on)",
    )


def serve_positional(p: argparse.ArgumentParser) -> None:
    """`flashlane serve MODEL`, vLLM's spelling of --model."""
    p.add_argument(
        "model_tag",
        nargs="?",
        default=None,
        metavar="MODEL",
        help="checkpoint folder or hub id, the same as --model (default: none)",
    )


def engine_options(args: argparse.Namespace) -> dict:
    """The LLM / AsyncEngine keyword arguments the parsed flags set (model excluded)."""
    opts = {}
    for f in fields(EngineConfig):
        flag = flag_of(f)
        dest = flag.dest if flag and flag.dest else flag_name(f)[2:].replace("-", "_")
        if flag is None or f.name == "model" or not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if is_switch(f):  # given, the flag flips the default
            value = (not f.default) if value else None
        opts[f.name] = value
    if opts.get("parallel") not in (None, "auto"):
        try:
            opts["parallel"] = int(opts["parallel"])
        except ValueError:
            raise SystemExit(f"--parallel must be auto or an int, got {args.parallel!r}") from None
    if args.enable_prefix_caching is False:
        if args.prompt_cache_gb not in (None, 0):
            raise SystemExit(
                "--no-enable-prefix-caching and --prompt-cache-gb "
                f"{args.prompt_cache_gb} disagree: give one"
            )
        opts["prompt_cache_gb"] = 0.0
    return {k: v for k, v in opts.items() if v is not None}


def model_of(args: argparse.Namespace) -> str | None:
    """--model, -m or the positional MODEL; two different ones are an error."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model is not None and tag != args.model:
        raise SystemExit(f"two models given: {tag!r} and --model {args.model!r}; give one")
    return args.model if args.model is not None else tag
