"""The engine flags of `flashlane serve` and `generate`: our names, vLLM's and llama.cpp's as
aliases, every one with its default in its help, and a parser that names the nearest flag when
it meets one it does not know (no abbreviations: `--mod x` is an error, not `--model x`)."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import NoReturn


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


def engine_flags(p: argparse.ArgumentParser) -> None:
    """The engine options of DESIGN.md section 8. Unset flags fall back to the environment,
    then to the defaults named here (EngineConfig holds them)."""
    p.add_argument(
        "--model",
        "-m",
        default=None,
        help="checkpoint folder or hub id org/name (default: the embedded model)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto, cpu or cuda[:N] (default: auto, cuda when torch sees a GPU)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        help="auto, bfloat16, float32 or float64 (default: "
        "auto, bfloat16 on cuda; the CPU always computes in float64, see README)",
    )
    p.add_argument(
        "--quantization",
        "-q",
        default=None,
        choices=["fp8"],
        help="fp8: quantize a bf16/fp32 checkpoint's linears to block FP8 (128x128 "
        "e4m3 blocks) at load; the GPU FP8 kernels are not built yet, so on cuda it "
        "too dequantizes to bf16, and the CPU computes the FP8 model's values in "
        "float64 (default: none, the weights as the checkpoint stores them; a block-"
        "FP8 checkpoint is read and dequantized either way)",
    )
    p.add_argument(
        "--parallel",
        "--max-num-seqs",
        "-np",
        default=None,
        metavar="N",
        help="sessions, the replies decoded at once: auto or N (default: auto, as "
        "many as fit, up to 16 on the CPU and 256 on a GPU)",
    )
    p.add_argument(
        "--context",
        "--max-model-len",
        "-c",
        type=int,
        default=None,
        metavar="TOKENS",
        help="positions per session, prompt plus reply (default: the model's window;"
        " unlike llama.cpp's -c, every session gets it, it is not divided by -np)",
    )
    p.add_argument(
        "--slot-contexts",
        default=None,
        help="sessions of different sizes, e.g. "
        '"65536,32768x3,16384x11" (default: FLASHNEXT_SLOT_CONTEXTS, else unset)',
    )
    p.add_argument(
        "--slot-grow",
        type=int,
        default=None,
        help="tokens of room a stream must "
        "have to start a round (default: FLASHNEXT_SLOT_GROW, else 8192)",
    )
    p.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="GiB for weights, "
        "sessions and workspace (default: FLASHNEXT_LOAD_LIMIT_GB, else 90%% of the "
        "GPU or 70%% of RAM)",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        metavar="FRACTION",
        help="the memory limit as a fraction of the device's memory, vLLM's name "
        "(default: 0.9 on a GPU, 0.7 of RAM on the CPU; --memory-limit-gb wins)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=None,
        help="rows per round, the verify batch (default: 64 on cuda, 16 on the CPU)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests that may wait for a session (default: 256)",
    )
    p.add_argument(
        "--no-drafts", action="store_true", help="no MTP or copy drafts (default: drafts on)"
    )
    p.add_argument(
        "--mtp-drafts", type=int, default=None, help="the longest MTP chain (default: 3)"
    )
    p.add_argument(
        "--mtp-confidence",
        type=float,
        default=None,
        help="the MTP head's probability a chain step needs (default: 0.7)",
    )
    p.add_argument(
        "--prompt-cache-gb",
        type=float,
        default=None,
        help="GiB of kept prompt "
        "states; 0: off (default: 1 on the CPU, 4 on a GPU, at most 1/8 of the limit)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's name for the prompt cache; --no-enable-prefix-"
        "caching is --prompt-cache-gb 0 (default: on)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE_OR_TEXT",
        help="a jinja chat template, a file or the template itself (default: the checkpoint's)",
    )
    p.add_argument(
        "--default-chat-template-kwargs",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="chat_template_kwargs every chat starts from, e.g. "
        "'{\"enable_thinking\": true}' (default: {}; the embedded model: "
        '{"enable_thinking": false})',
    )
    p.add_argument(
        "--unpriced",
        action="store_true",
        default=None,
        help="draft rows without the timed cost table (default: priced; FLASHLANE_UNPRICED=1)",
    )
    p.add_argument(
        "--no-lone",
        action="store_true",
        help="no lone driver for a single stream "
        "on cuda (default: lone driver on; FLASHLANE_NO_LONE=1)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=None,
        help="processes (one per device) the heads and experts are split over; rank 0 "
        "spawns the others, or joins the group torchrun started (default: 1)",
    )
    p.add_argument(
        "--lone-streams",
        type=int,
        default=None,
        help="live streams the lone driver may decode together on cuda (default: every session)",
    )


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


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
    parallel = args.parallel
    if parallel not in (None, "auto"):
        try:
            parallel = int(parallel)
        except ValueError:
            raise SystemExit(f"--parallel must be auto or an int, got {parallel!r}") from None
    opts = dict(
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        parallel=parallel,
        context=args.context,
        slot_contexts=args.slot_contexts,
        slot_grow=args.slot_grow,
        memory_limit_gb=args.memory_limit_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_rows=args.max_rows,
        max_queue=args.max_queue,
        mtp_drafts=args.mtp_drafts,
        mtp_confidence=args.mtp_confidence,
        prompt_cache_gb=args.prompt_cache_gb,
        chat_template=args.chat_template,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        unpriced=args.unpriced,
        lone_streams=args.lone_streams,
        tensor_parallel_size=args.tensor_parallel_size,
        seed=getattr(args, "engine_seed", None),
    )
    if args.enable_prefix_caching is False:
        if args.prompt_cache_gb not in (None, 0):
            raise SystemExit(
                "--no-enable-prefix-caching and --prompt-cache-gb "
                f"{args.prompt_cache_gb} disagree: give one"
            )
        opts["prompt_cache_gb"] = 0.0
    if args.no_drafts:
        opts["drafts"] = False
    if args.no_lone:
        opts["lone"] = False
    return {k: v for k, v in opts.items() if v is not None}


def model_of(args: argparse.Namespace) -> str | None:
    """--model, -m or the positional MODEL; two different ones are an error."""
    tag = getattr(args, "model_tag", None)
    if tag is not None and args.model is not None and tag != args.model:
        raise SystemExit(f"two models given: {tag!r} and --model {args.model!r}; give one")
    return args.model if args.model is not None else tag
