"""`flashlane bench model`: decode and prefill speed of one model on the GPU, against the
roofline measured in the same run and (optionally) transformers on the same weights.

    flashlane bench model --config flashnext-12l --random-weights --peer transformers
    flashlane bench model --config flashnext-4l --random-weights --peer llama.cpp \
        --llama-cpp .peer/build          # or FLASHLANE_LLAMA_CPP; the GGUF goes to --gguf-dir

Decode: N streams (N in --streams), each a --prompt-len prompt of random ids, greedy, drafts
off, --decode-tokens tokens past the first (ignore_eos); aggregate tok/s = N x tokens / the
longest stream's decode time. Prefill: one prompt of each --prefill length, one token out,
--prefill-repeats timed runs of another prompt each after a warm one; tok/s = length / the
median time to first token (the runs, min and spread kept). The table ends with one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import replace

import torch

from flashlane.bench.common import FLAT_COSTS, commit, random_prompts, sync
from flashlane.bench.model_figures import (
    FILL_ROOM,
    decode_figures,
    kernels_name,
    launches_per_token,
    memory_figures,
    prefill_rows,
    prompt_cache_ttft,
    replies,
    sampled_params,
)
from flashlane.bench.model_table import failed_exit, table
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.engine_plan import table_dtype_for
from flashlane.flags import FlagParser
from flashlane.llm import LLM
from flashlane.models.config import ModelConfig
from flashlane.models.presets import PRESETS, config_dict
from flashlane.models.random_weights import build_random, random_table_place
from flashlane.request import SamplingParams
from flashlane.roofline import measure_ceilings


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse(argv: list[str]) -> argparse.Namespace:
    p = FlagParser(
        prog="flashlane bench model",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--config",
        default="flashnext-12l",
        help=f"a preset ({', '.join(sorted(PRESETS))}) or a config.json",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        required=True,
        help="build the config's checkpoint with random weights on the device",
    )
    p.add_argument("--device", default="cuda", help="where the model runs")
    p.add_argument("--quantization", choices=["fp8"], help="build the linears in block FP8")
    p.add_argument(
        "--ple-table-device", choices=["auto", "cpu", "cuda"], help="auto: the GPU if it fits"
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "bf16", "fp8"],
        default="auto",
        help="fp8: the attention caches in e4m3 with per-row scales (default: auto)",
    )
    p.add_argument(
        "--kernels",
        choices=["auto", "walk", "gather", "listed"],
        default="auto",
        help="decode windows through the split walk and one select program a row, the "
        "gathered or the listed attention (EngineConfig.kernels; default: auto)",
    )
    p.add_argument(
        "--ple-table-dtype",
        choices=["auto", "bf16", "int8"],
        default="auto",
        help="int8: the tables in host memory in 8 bits; auto: int8 only where bf16 is over "
        "the host's ceiling",
    )
    p.add_argument("--seed", type=int, default=0, help="of the random weights and prompts")
    p.add_argument(
        "--streams", type=_ints, default=[1, 4, 16], help="decode concurrencies, comma-separated"
    )
    p.add_argument(
        "--prompt-len",
        type=_ints,
        default=[64],
        help="each decode stream's prompt, comma-separated: decode is timed at the first in "
        "`decode`, at the others (long contexts, issue 29) in `decode_context`",
    )
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens timed per stream")
    p.add_argument(
        "--prefill",
        type=_ints,
        default=[2048, 16384],
        help="prompt lengths timed for prefill, comma-separated",
    )
    p.add_argument(
        "--prefill-repeats",
        type=int,
        default=5,
        help="timed runs of each prefill length (another prompt each): median and min",
    )
    p.add_argument(
        "--prompt-cache",
        type=int,
        default=0,
        metavar="TOKENS",
        help="also time a TOKENS-long prompt cold, resent and extended by a turn",
    )
    p.add_argument(
        "--peer",
        choices=["none", "transformers", "llama.cpp"],
        default="none",
        help="also time a peer on the same weights",
    )
    p.add_argument(
        "--peer-prefill",
        type=_ints,
        default=[2048],
        help="transformers' prefill lengths (llama.cpp takes --prefill's)",
    )
    p.add_argument(
        "--llama-cpp",
        default=None,
        metavar="DIR",
        help="a llama.cpp build (default: $FLASHLANE_LLAMA_CPP)",
    )
    p.add_argument(
        "--gguf-dir",
        default=".peer/gguf",
        help="where the checkpoint's GGUF is written (and kept for the next run)",
    )
    p.add_argument(
        "--llama-threads",
        type=int,
        default=None,
        help="llama.cpp's CPU threads (its default where unset)",
    )
    p.add_argument(
        "--sampled",
        action="store_true",
        help="also time one sampled stream (top_k 40), one top_p stream (0.9), one with "
        "presence and frequency penalties (0.5) and one with logprobs (5), beside one greedy "
        "stream",
    )
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)
    if args.ple_table_dtype == "int8" and args.ple_table_device == "cuda":
        p.error("--ple-table-dtype int8: the 8-bit tables live in host memory only")
    if args.prefill_repeats < 1:
        p.error(f"--prefill-repeats: at least 1, got {args.prefill_repeats}")
    if not args.prompt_len or min(args.prompt_len) < 1:
        p.error(f"--prompt-len: positive lengths, got {args.prompt_len}")
    # the first length is the one every other figure (and the peers) use
    args.prompt_lens, args.prompt_len = args.prompt_len, args.prompt_len[0]
    return args


def run_ours(args, raw: dict, ceilings: dict) -> dict:
    t0 = time.perf_counter()
    cuda = args.device.startswith("cuda")
    q, tables, asked = args.quantization, args.ple_table_device, args.ple_table_dtype
    tables = random_table_place(raw, args.device, q, tables, asked)
    dtype = torch.bfloat16 if cuda else torch.float64
    eight = table_dtype_for(asked, ModelConfig.from_hf(raw), tables, dtype.itemsize)
    cfg, model = build_random(raw, dtype, args.device, args.seed, q, tables, table_dtype=eight)
    sync(args.device)
    built_s = time.perf_counter() - t0
    longest = max([*args.prefill, args.prompt_cache + 200 if args.prompt_cache else 0])
    # with room for the tokens the first streams decode while the others' prompts fill,
    # before the rounds that count (decode_together), within the model's window
    context = longest + max(args.prompt_lens) + args.decode_tokens + 64
    context = max(context, min(context + FILL_ROOM, cfg.max_position_embeddings))
    config = EngineConfig.resolve(
        device=args.device,
        parallel=max(args.streams),
        context=context,
        drafts=False,
        prompt_cache_gb=0,
        kv_cache_dtype=args.kv_cache_dtype,
        kernels=args.kernels,
    )
    llm = LLM.from_engine(Engine(config, costs=FLAT_COSTS, built=(cfg, model)))
    started = torch.cuda.memory_allocated() if cuda else 0
    if cuda:  # the peak of the rounds below, not of the build
        torch.cuda.reset_peak_memory_stats()
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    greedy = replace(one, max_tokens=args.decode_tokens + 1)
    # Triton compiles a kernel variant the first time a shape class meets it (minutes in all):
    # run every measured shape once first, so the figures below time no compilation (decode
    # steps run the same kernels at any length: longer prompts warm with one stream)
    t0 = time.perf_counter()
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, draft=False)
    for length in args.prompt_lens:
        for n in args.streams if length == args.prompt_len else args.streams[:1]:
            llm.generate(random_prompts(n, length, cfg.vocab_size, 99), warm)
    if 1 in args.streams:  # one stream's lone steps warm too (their graphs are made at start)
        llm.generate(random_prompts(1, args.prompt_len, cfg.vocab_size, 97), greedy)
        if llm.engine.host.lone is not None:  # and its shared rounds, measured below
            lone, llm.engine.host.lone = llm.engine.host.lone, None
            try:
                llm.generate(random_prompts(1, args.prompt_len, cfg.vocab_size, 96), warm)
            finally:
                llm.engine.host.lone = lone
    if args.sampled:
        for params in sampled_params(args).values():
            llm.generate(random_prompts(1, args.prompt_len, cfg.vocab_size, 95), params)
    failed = {}  # a prompt length the engine cannot run ends its row, not the run
    for length in args.prefill:
        try:
            replies(llm.generate(random_prompts(1, length, cfg.vocab_size, 98), one))
        except RuntimeError as err:
            failed[length] = str(err).splitlines()[0]
    out = {
        "build_s": built_s,
        "warm_s": time.perf_counter() - t0,
        "kernels": kernels_name(llm.engine.kernels.name, args.kernels),
        "decode": {},
        "prefill": {},
    }
    host = llm.engine.host
    lone = host.lone
    out["decode"] = decode_rows(args, llm, cfg, greedy, ceilings, args.prompt_len)
    if args.prompt_lens[1:]:  # the same streams at longer contexts
        out["decode_context"] = {
            length: decode_rows(args, llm, cfg, greedy, ceilings, length)
            for length in args.prompt_lens[1:]
        }
    if args.sampled:  # one stream each, greedy again beside them
        runs = {"greedy": greedy, **sampled_params(args)}
        out["decode_sampled"] = {
            k: decode_figures(args, llm, cfg, 1, p, ceilings) for k, p in runs.items()
        }
    if cuda:
        out["launches_per_token"] = launches_per_token(llm, cfg)
    if lone is not None and 1 in args.streams:
        # one stream through shared rounds too: the lone driver's gain, side by side
        host.lone = None
        out["decode_shared_rounds"] = {1: decode_figures(args, llm, cfg, 1, greedy, ceilings)}
        if cuda:
            out["launches_per_token_shared_rounds"] = launches_per_token(llm, cfg)
        host.lone = lone
        out["lone"] = {
            "steps": lone.num_steps,
            "graphs": len(lone.graphs),
            "capture_s": lone.capture_seconds,
            "over_shared_rounds": out["decode"][1]["tok_s"]
            / out["decode_shared_rounds"][1]["tok_s"],
        }
    out["lone_failed"] = lone.failed if lone is not None else None  # eager steps (1a68afd)
    out["prefill"] = prefill_rows(
        args, llm, cfg, ceilings.get("bf16_flops"), failed, ceilings.get("fp8_flops")
    )
    if cuda:
        out["memory"] = memory_figures(llm, started)
    graphs = llm.engine.model.graphs
    if graphs is not None:
        out["graphs"] = {
            "captured": len(graphs.entries),
            "capture_s": graphs.capture_seconds,
            "failed": graphs.failed,
        }
    del llm
    gc.collect()
    if args.prompt_cache:
        out["prompt_cache"] = prompt_cache_ttft(args, cfg, model, config)
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def decode_rows(args, llm, cfg, greedy, ceilings, prompt_len: int) -> dict:
    """decode_figures for each --streams count at this prompt length; a count the engine
    cannot run ends its row, not the run (and the peer's)."""
    rows = {}
    for n in args.streams:
        try:
            rows[n] = decode_figures(args, llm, cfg, n, greedy, ceilings, prompt_len)
        except (RuntimeError, torch.OutOfMemoryError) as err:
            rows[n] = {"error": str(err).splitlines()[0]}
    return rows


def bench_model_main(argv: list[str]) -> int:
    args = parse(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(
            "flashlane bench model: no CUDA device here (--device cpu runs a smoke test)",
            file=sys.stderr,
        )
        return 2
    raw = config_dict(args.config)
    if args.quantization and args.peer != "none":
        raise SystemExit("--quantization fp8 has no peer on the same weights: --peer none")
    # an FP8 model's prefill is held to the e4m3 matrix rate too (issue 34)
    ceilings = measure_ceilings(args.device, fp8=args.quantization == "fp8") if cuda else {}
    if cuda:
        torch.cuda.empty_cache()
    result = {
        "bench": "model",
        "config": args.config,
        "device": torch.cuda.get_device_name(args.device) if cuda else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "command": "flashlane bench model " + " ".join(argv),
        "ceilings": ceilings,
        "note": "random weights route tokens evenly over experts",
        "ours": run_ours(args, raw, ceilings),
    }
    if args.peer == "transformers":
        from flashlane.bench.peer import run_transformers

        result["peer"] = run_transformers(raw, args)
    elif args.peer == "llama.cpp":
        from flashlane.bench.peer import run_llama_cpp

        result["peer"] = run_llama_cpp(raw, args)
    print(table(result))
    line = json.dumps(result)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    print(line)
    return failed_exit(result)  # 1: figures of another engine than the product's


if __name__ == "__main__":
    sys.exit(bench_model_main(sys.argv[1:]))
