"""flashlane serve | generate | bench | info | --version"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

from flashlane import __version__
from flashlane.config import EngineConfig
from flashlane.flags import (
    FlagParser,
    engine_flags,
    engine_options,
    model_of,
    serve_positional,
)
from flashlane.options import flag_of
from flashlane.planning.limits import LIMIT_ENV
from flashlane.planning.memory import OverMemoryLimit


def cmd_generate(args: argparse.Namespace) -> int:
    from flashlane.llm import LLM
    from flashlane.request import SamplingParams

    if (args.prompt is None) == (args.prompt_ids is None):
        raise SystemExit("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    prompt = args.prompt
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise SystemExit(
                f"--prompt-ids must be comma-separated ints: {args.prompt_ids!r}"
            ) from None
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        draft=not args.no_drafts,
    )
    llm = LLM(
        model=_checked_model(args, needs_tokenizer=args.prompt is not None), **engine_options(args)
    )
    out = llm.generate(prompt, params)[0]
    if args.json:
        print(
            json.dumps(
                {
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "finish_reason": str(out.finish_reason.value if out.finish_reason else None),
                    "seed": out.seed,
                    "error": out.error,
                    "stats": vars(out.stats)
                    if hasattr(out.stats, "__dict__")
                    else _stats(out.stats),
                }
            )
        )
    else:
        print((prompt if isinstance(prompt, str) else "") + out.text)
        if out.error:
            print(f"error: {out.error}", file=sys.stderr)
    return 1 if out.error else 0


def _checked_model(args: argparse.Namespace, *, needs_tokenizer: bool) -> str | None:
    """The model to load, checked before anything heavy (raises ValueError: one line)."""
    from flashlane.preflight import preflight

    model = model_of(args)
    folder, name = preflight(model, device=args.device, needs_tokenizer=needs_tokenizer)
    if getattr(args, "served_model_name", "") is None:
        args.served_model_name = name if model is not None else None
    return None if model is None else str(folder)


def _stats(stats) -> dict:
    return {k: getattr(stats, k) for k in stats.__slots__} if hasattr(stats, "__slots__") else {}


def cmd_info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flashlane.models.config import ModelConfig
    from flashlane.models.fp8 import read_quant_spec
    from flashlane.planning.info import describe

    path = Path(args.model_path)
    cfg = ModelConfig.from_hf(path)
    quant = read_quant_spec(path)
    if quant is None and args.quantization == "fp8":
        from flashlane.models.fp8 import QuantSpec

        quant = QuantSpec()
    plan = None
    asked = (
        args.slot_contexts,
        args.memory_limit_gb,
        args.context,
        args.parallel,
        args.ple_table_dtype,
    )
    tp = args.tensor_parallel_size
    if any(a is not None for a in asked) or os.environ.get(LIMIT_ENV) or tp > 1:
        from flashlane.planning.info_plan import info_plan

        plan = info_plan(cfg, args, os.environ, quant)
    print(describe(cfg, plan, quant))
    if tp > 1:
        experts = "experts placed" if args.expert_parallel else "expert widths"
        print(f"\n(the memory plan is one rank's of {tp}: heads, {experts} and the lm_head")
        print(" split, the rest replicated; flashlane/parallel/plan.py)")
    return 0


def build_parser() -> FlagParser:
    parser = FlagParser(prog="flashlane", description=__doc__)
    parser.add_argument("--version", action="version", version=f"flashlane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a reply to one prompt")
    engine_flags(gen)
    gen.add_argument(
        "--prompt", default=None, help="the prompt text, or --prompt-ids (default: none)"
    )
    gen.add_argument(
        "--prompt-ids", default=None, help="the prompt as token ids: 1,2,3 (default: none)"
    )
    gen.add_argument("--max-tokens", type=int, default=64, help="reply tokens (default: 64)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default: 0)")
    gen.add_argument("--top-k", type=int, default=0, help="0: no limit (default: 0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="(default: 1.0)")
    gen.add_argument("--min-p", type=float, default=0.0, help="(default: 0.0)")
    gen.add_argument("--seed", type=int, default=None, help="(default: a fresh random one)")
    gen.add_argument("--json", action="store_true", help="print one JSON object (default: text)")

    info = sub.add_parser("info", help="config, parameter counts and memory plan of a model")
    info.add_argument(
        "model_path", help="checkpoint folder or config.json (default: none, required)"
    )
    info.add_argument(
        "--device",
        default=None,
        choices=["cuda", "cpu"],
        help="the device to plan for (default: cuda)",
    )
    info.add_argument(
        "--context",
        type=int,
        default=None,
        help="positions per session (default: the model's window)",
    )
    info.add_argument("--parallel", default=None, help="sessions (default: auto)")
    info.add_argument(
        "--slot-contexts", default=None, help="sessions of different sizes (default: unset)"
    )
    info.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="GiB ceiling (default on cuda: an H200's 139.8 GiB less 5 GiB; 70%% of RAM)",
    )
    info.add_argument(
        "--max-rows", type=int, default=None, help="rows per round (default: 64 cuda, 16 cpu)"
    )
    info.add_argument(
        "--quantization",
        default=None,
        choices=["fp8"],
        help="plan a plain checkpoint quantized to block FP8 at load (default: as stored)",
    )
    info.add_argument(
        "--ple-table-device",
        default=None,
        choices=["auto", "cpu", "cuda"],
        help="where the n-gram tables go (default: auto, cuda when the plan fits, else the "
        "host's memory)",
    )
    info.add_argument(
        "--ple-table-dtype",
        default=None,
        choices=["auto", "bf16", "int8"],
        help="the n-gram tables' values in host memory: bf16 or int8 with a per-row scale "
        "(int8 puts them there) (default: auto, int8 only where bf16 is over the host's "
        "ceiling)",
    )
    kv = next(flag_of(f) for f in fields(EngineConfig) if f.name == "kv_cache_dtype")
    info.add_argument("--kv-cache-dtype", default=None, choices=kv.choices, help=kv.help)
    info.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        help="plan one rank of N: its weights and its sessions' heads (default: 1)",
    )
    info.add_argument(
        "--expert-parallel",
        action="store_true",
        help="with -tp N: experts placed whole on the ranks, E / N each (default: split)",
    )
    info.add_argument(
        "--prompt-cache-gb",
        type=float,
        default=None,
        help="GiB of prompt states to plan for (default: planned by memory)",
    )

    serve = sub.add_parser("serve", help="the OpenAI-compatible server")
    serve_positional(serve)
    engine_flags(serve, serve=True)  # with serve's --seed, the engine's
    _serve_flags(serve)
    bench_only = serve.add_argument_group("benchmark-only")
    bench_only.add_argument(
        "--random-weights",
        action="store_true",
        help="serve --config with random weights made on the device, the "
        "embedded model's tokenizer (default: off; a benchmark's model)",
    )
    bench_only.add_argument(
        "--config",
        default=None,
        help="with --random-weights: a preset (flashnext-12l, ...) or a "
        "config.json (default: none)",
    )
    bench_only.add_argument(
        "--weights-seed",
        type=int,
        default=0,
        help="with --random-weights: the weights' seed (default: 0)",
    )

    bench = sub.add_parser("bench", help="benchmarks: serve (a client) or model")
    bench.add_argument(
        "what", choices=["serve", "model"], help="which benchmark (default: none, required)"
    )
    bench.add_argument(
        "rest", nargs=argparse.REMAINDER, help="its flags, see its --help (default: none)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "info":
            return cmd_info(args)
        if args.command == "serve":
            from flashlane.server.flags import load_serve_main

            serve_main = load_serve_main()
            # checked before the port is bound: a bad model or device is one line, exit 2
            if args.random_weights:
                _check_random(args)
            else:
                args.model, args.model_tag = _checked_model(args, needs_tokenizer=True), None
            serve_main(args)
            return 0
        if args.command == "bench":
            return _bench(args)
    except (ValueError, FileNotFoundError, OverMemoryLimit) as err:
        print(f"flashlane: {err}", file=sys.stderr)
        return 2
    return 2


def _check_random(args: argparse.Namespace) -> None:
    """--random-weights serves --config (a preset or config.json), no model."""
    from flashlane.flags import model_of
    from flashlane.models.presets import PRESETS

    if model_of(args) is not None:
        raise ValueError("--random-weights serves --config; give no model")
    if args.config is None:
        raise ValueError(
            f"--random-weights needs --config: a preset ({', '.join(PRESETS)}) or a config.json"
        )
    if args.config not in PRESETS and not args.config.endswith(".json"):
        raise ValueError(
            f"--config {args.config!r}: no such preset ({', '.join(PRESETS)}), nor a config.json"
        )
    args.model, args.model_tag = None, None
    if getattr(args, "served_model_name", None) is None:
        args.served_model_name = f"{args.config}-random"


def _serve_flags(p: argparse.ArgumentParser) -> None:
    from flashlane.server.flags import add_serve_flags

    add_serve_flags(p)


def _bench(args: argparse.Namespace) -> int:
    if args.what == "serve":
        from flashlane.bench.serve import bench_serve_main

        return bench_serve_main(args.rest)
    from flashlane.bench.model import bench_model_main

    return bench_model_main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
