"""flashlane serve | generate | bench | info | --version"""

from __future__ import annotations

import argparse
import json
import os
import sys

from flashlane import __version__
from flashlane.sessions.limits import LIMIT_ENV
from flashlane.sessions.memory import OverMemoryLimit


def engine_flags(p: argparse.ArgumentParser) -> None:
    """The engine options of DESIGN.md section 8 (unset flags fall back to env, then defaults)."""
    p.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--parallel", default=None, help="sessions: auto or N")
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--slot-contexts", default=None, help='e.g. "65536,32768x3,16384x11"')
    p.add_argument("--slot-grow", type=int, default=None)
    p.add_argument("--memory-limit-gb", type=float, default=None)
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--no-drafts", action="store_true")
    p.add_argument("--mtp-drafts", type=int, default=None)
    p.add_argument("--mtp-confidence", type=float, default=None)
    p.add_argument(
        "--prompt-cache-gb", type=float, default=None, help="GiB of kept prompt states; 0: off"
    )
    p.add_argument("--unpriced", action="store_true", default=None)
    p.add_argument("--no-lone", action="store_true")
    p.add_argument("--lone-streams", type=int, default=None,
                   help="greedy streams the lone driver may decode together (default 1)")


def engine_options(args: argparse.Namespace) -> dict:
    parallel = args.parallel
    if parallel not in (None, "auto"):
        try:
            parallel = int(parallel)
        except ValueError:
            raise SystemExit(f"--parallel must be auto or an int, got {parallel!r}") from None
    opts = dict(
        device=args.device,
        dtype=args.dtype,
        parallel=parallel,
        context=args.context,
        slot_contexts=args.slot_contexts,
        slot_grow=args.slot_grow,
        memory_limit_gb=args.memory_limit_gb,
        max_rows=args.max_rows,
        max_queue=args.max_queue,
        mtp_drafts=args.mtp_drafts,
        mtp_confidence=args.mtp_confidence,
        prompt_cache_gb=args.prompt_cache_gb,
        unpriced=args.unpriced,
        lone_streams=args.lone_streams,
    )
    if args.no_drafts:
        opts["drafts"] = False
    if args.no_lone:
        opts["lone"] = False
    return {k: v for k, v in opts.items() if v is not None}


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
    llm = LLM(model=args.model, **{k: v for k, v in engine_options(args).items() if k != "model"})
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


def _stats(stats) -> dict:
    return {k: getattr(stats, k) for k in stats.__slots__} if hasattr(stats, "__slots__") else {}


def cmd_info(args: argparse.Namespace) -> int:
    from pathlib import Path

    from flashlane.models.config import ModelConfig
    from flashlane.models.info import describe

    path = Path(args.model_path)
    cfg = ModelConfig.from_hf(path)
    plan = None
    asked = (args.slot_contexts, args.memory_limit_gb, args.context, args.parallel)
    if any(a is not None for a in asked) or os.environ.get(LIMIT_ENV):
        plan = _info_plan(cfg, args, os.environ)
    print(describe(cfg, plan))
    return 0


def _info_plan(cfg, args, env):
    """The plan the engine would make: the same ceiling (flag, then FLASHNEXT_LOAD_LIMIT_GB)
    and the same prompt cache budget beside the sessions."""
    from flashlane.sessions import memory
    from flashlane.sessions.slots import parse_slot_contexts

    device, slots = args.device or "cuda", args.slot_contexts
    limit = memory.resolve_limit_bytes(args.memory_limit_gb, env, device, 141 * 2**30)
    cache_gb = args.prompt_cache_gb
    if cache_gb is None and env.get("FLASHLANE_PROMPT_CACHE_GB"):
        cache_gb = float(env["FLASHLANE_PROMPT_CACHE_GB"])
    weights = memory.weight_bytes(cfg, 2 if device == "cuda" else 8, table=device != "cuda")
    return memory.plan(
        cfg,
        device=device,
        limit_bytes=limit,
        weight_bytes=weights,
        max_rows=args.max_rows or (64 if device == "cuda" else 16),
        context=args.context,
        slot_contexts=None if slots is None else parse_slot_contexts(slots),
        parallel=None if args.parallel in (None, "auto") else int(args.parallel),
        prompt_rows=memory.PREFILL_ROWS[device],
        prompt_cache_bytes=memory.resolve_prompt_cache_bytes(cache_gb, device, limit),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashlane", description=__doc__)
    parser.add_argument("--version", action="version", version=f"flashlane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate a reply to one prompt")
    engine_flags(gen)
    gen.add_argument("--prompt", default=None)
    gen.add_argument("--prompt-ids", default=None)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--json", action="store_true")

    info = sub.add_parser("info", help="config, parameter counts and memory plan of a model")
    info.add_argument("model_path")
    info.add_argument("--device", default=None, choices=["cuda", "cpu"])
    info.add_argument("--context", type=int, default=None)
    info.add_argument("--parallel", default=None)
    info.add_argument("--slot-contexts", default=None)
    info.add_argument("--memory-limit-gb", type=float, default=None)
    info.add_argument("--max-rows", type=int, default=None)
    info.add_argument("--prompt-cache-gb", type=float, default=None)

    serve = sub.add_parser("serve", help="the OpenAI-compatible server")
    engine_flags(serve)
    _serve_flags(serve)

    bench = sub.add_parser("bench", help="benchmarks: serve (a client) or model")
    bench.add_argument("what", choices=["serve", "model"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)

    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "info":
            return cmd_info(args)
        if args.command == "serve":
            from flashlane.server.serve import serve_main

            serve_main(args)
            return 0
        if args.command == "bench":
            return _bench(args)
    except (ValueError, FileNotFoundError, OverMemoryLimit) as err:
        print(f"flashlane: {err}", file=sys.stderr)
        return 2
    return 2


def _serve_flags(p: argparse.ArgumentParser) -> None:
    try:
        from flashlane.server.serve import add_serve_flags
    except ImportError:
        return
    add_serve_flags(p)


def _bench(args: argparse.Namespace) -> int:
    if args.what == "serve":
        from flashlane.bench_serve import bench_serve_main

        return bench_serve_main(args.rest)
    from flashlane.bench_model import bench_model_main

    return bench_model_main(args.rest)


if __name__ == "__main__":
    sys.exit(main())
