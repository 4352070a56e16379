"""The figures `flashlane bench model` measures on a built engine, one function each: n
streams decoding together against the roofline, kernel launches per token, and the prompt
cache's time to first token; and the check that every timed reply is whole."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import replace

import torch

from flashlane.bench.common import FLAT_COSTS, random_prompts
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.llm import LLM
from flashlane.models.fp8 import QuantSpec
from flashlane.models.host_tables import table_dtype_of
from flashlane.request import SamplingParams
from flashlane.roofline import decode_round_bytes, prefill_flops

FILL_ROOM = 4096  # positions a session keeps for tokens decoded while other prompts fill


def kernels_name(name: str, asked: str) -> str:
    """The kernel set's name, `triton+walk` (`+gather`, `+listed`) for a comparison run."""
    return f"{name}+{asked}" if asked != "auto" and name == "triton" else name


def sampled_params(args) -> dict[str, SamplingParams]:
    """The sampled streams --sampled times: a keyed top_k draw, a top_p one, one with
    penalties (sampling/adjusted_draw.py in the lone step) and one that asks for logprobs
    (sampling/logprobs.StepLogprobs, in the step too)."""
    common = dict(
        max_tokens=args.decode_tokens + 1, temperature=0.8, seed=7, ignore_eos=True, draft=False
    )
    return {
        "top_k 40": SamplingParams(top_k=40, **common),
        "top_p 0.9": SamplingParams(top_p=0.9, **common),
        "penalties": SamplingParams(presence_penalty=0.5, frequency_penalty=0.5, **common),
        "logprobs 5": SamplingParams(logprobs=5, **common),
    }


def replies(outs: list) -> list:
    """The outputs, once each is a whole reply: an error (a refused prompt, a failed round)
    raises here instead of timing nothing (a refused 8,192-token prompt once read as 63M
    tokens a second)."""
    for o in outs:
        if o.error or not o.token_ids:
            raise RuntimeError(f"bench model: request {o.request_id} failed: {o.error}")
    return outs


def decode_figures(
    args, llm: LLM, cfg, n: int, greedy: SamplingParams, ceilings: dict, prompt_len=None
) -> dict:
    """n streams decoding together after prompts of prompt_len (default --prompt-len's
    first): tok/s, the round's time and its roofline, over rounds in which all n decode."""
    prompt_len = prompt_len or args.prompt_len
    prompts = random_prompts(n, prompt_len, cfg.vocab_size, n)
    tokens, secs = decode_together(llm, prompts, greedy, args.decode_tokens)
    round_s = secs * n / tokens
    fp8 = QuantSpec() if args.quantization == "fp8" else None
    int8 = table_dtype_of(llm.engine.model) == "int8"
    context = prompt_len + args.decode_tokens
    kv8 = llm.engine.sessions[0].kv_fp8
    need = decode_round_bytes(cfg, n, context, fp8=fp8, table_int8=int8, kv_fp8=kv8)["total"]
    bw = ceilings.get("bandwidth_Bps")
    return {
        "tok_s": tokens / secs,
        "round_ms": 1e3 * round_s,
        "round_bytes": need,
        "roofline_ms": 1e3 * need / bw if bw else None,
        "of_roofline": need / bw / round_s if bw else None,
    }


def decode_together(llm: LLM, prompts: list, params: SamplingParams, rounds: int):
    """(tokens, seconds) of the rounds in which every stream of `prompts` decodes: from the
    round that gives the last stream its first token (every prompt is in by then) until each
    has `rounds` more tokens; then the streams are cancelled. Streams that finish their prompt
    first decode while the others fill (a long prompt's pieces share rounds with them): those
    rounds are prefill's, not counted here. A stream that ends inside the window (its session
    full) raises: the bench sizes sessions with room for the tokens before the window."""
    host = llm.engine.host
    streams = []
    for i, prompt in enumerate(prompts):
        most = host.sessions.max_model_len - len(prompt)  # a session's whole room
        host.submit(f"together-{i}", prompt, replace(params, max_tokens=most))
        streams.append(host.waiting[-1])
    t0 = counts = None
    try:
        while True:
            host.run_once()
            now = time.perf_counter()
            if any(s.is_finished for s in streams):
                ended = [(s.request_id, s.finish, s.error, len(s.reply_ids)) for s in streams]
                raise RuntimeError(f"bench model: a stream ended while decoding: {ended}")
            if counts is None:
                if all(s.reply_ids for s in streams):
                    t0, counts = now, [len(s.reply_ids) for s in streams]
            elif all(len(s.reply_ids) - c >= rounds for s, c in zip(streams, counts)):
                return sum(len(s.reply_ids) - c for s, c in zip(streams, counts)), now - t0
    finally:
        for s in streams:
            host.cancel(s.request_id)
        while host.has_work:
            host.run_once()


def launches_per_token(llm: LLM, cfg) -> float:
    """Kernel launches (a graph replay counts one) per decoded token of one greedy stream:
    a 9-token reply's launches less a 1-token reply's (the prompt piece), over 8 tokens."""
    from torch.profiler import ProfilerActivity, profile

    prompt = random_prompts(1, 64, cfg.vocab_size, 5)
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")
    counts = []
    for tokens in (1, 9):
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, draft=False)
        llm.generate(prompt, params)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate(prompt, params)
        counts.append(sum(e.count for e in prof.key_averages() if e.key.startswith(names)))
    return (counts[1] - counts[0]) / 8


def prefill_seconds(llm: LLM, vocab: int, length: int, seed: int) -> float:
    """Time to first token of one random prompt of `length` (seeded), one token out; the
    Python collector run before and held off during it (a pause inside a 2k prompt's 60 ms
    is a jitter of the host, not of the prefill)."""
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    prompts = random_prompts(1, length, vocab, seed)
    gc.collect()
    gc.disable()
    try:
        return replies(llm.generate(prompts, one))[0].stats.prefill_seconds
    finally:
        gc.enable()


def prefill_rows(
    args, llm: LLM, cfg, rate: float | None, failed: dict, fp8_rate: float | None = None
) -> dict:
    """Each --prefill length: the median TTFT of --prefill-repeats fresh prompts (timed after
    the warm one), min, runs, spread and share of the bf16 matrix rate (`rate`), and of the
    e4m3 one (`fp8_rate`, for an FP8 model); a length whose warm prompt failed gives its
    error."""
    rows = {}
    for length in args.prefill:
        if length in failed:
            rows[length] = {"error": failed[length]}
            continue
        seeds = range(length, length + args.prefill_repeats)  # another prompt each: no cache
        runs = sorted(prefill_seconds(llm, cfg.vocab_size, length, seed) for seed in seeds)
        ttft = statistics.median(runs)
        rows[length] = {
            "tok_s": length / ttft,
            "ttft_s": ttft,
            "ttft_min_s": runs[0],
            "ttft_runs_s": runs,
            "spread": runs[-1] / runs[0] - 1,  # slowest over fastest
            "flops": prefill_flops(cfg, length),
            "of_matrix_rate": prefill_flops(cfg, length) / rate / ttft if rate else None,
        }
        if fp8_rate:
            rows[length]["of_fp8_matrix_rate"] = prefill_flops(cfg, length) / fp8_rate / ttft
    return rows


def memory_figures(llm: LLM, started: int) -> dict:
    """GiB of GPU memory: the engine's plan beside what was allocated once it started
    (`started` bytes: weights, sessions, graphs) and at the rounds' peak since (peak stats
    reset at start), and the peak reserved: the plan's allowances against what ran."""
    plan, gib = llm.engine.plan, 2**30
    return {
        "started_gib": started / gib,
        "plan_limit_gib": plan.limit_bytes / gib,
        "plan_weights_gib": plan.weight_bytes / gib,
        "plan_sessions_gib": plan.sessions_bytes / gib,
        "plan_workspace_gib": plan.workspace_bytes / gib,
        "prompt_rows": plan.prompt_rows,  # after the engine fitted them to its start
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / gib,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / gib,
    }


def prompt_cache_ttft(args, cfg, model, config: EngineConfig) -> dict:
    """Time to first token of one long prompt: cold, resent, and extended by one turn."""
    from dataclasses import replace

    llm = LLM.from_engine(
        Engine(replace(config, prompt_cache_gb=8.0), costs=FLAT_COSTS, built=(cfg, model))
    )
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, draft=False)
    length = args.prompt_cache
    prompt = random_prompts(1, length, cfg.vocab_size, 7)[0]
    turn = random_prompts(1, 200, cfg.vocab_size, 8)[0]
    out = {"tokens": length}
    for name, ids in (("cold", prompt), ("resent", prompt), ("extended", prompt + turn)):
        o = llm.generate([ids], one)[0]
        out[name] = {"ttft_s": o.stats.prefill_seconds, "cached_tokens": o.stats.cached_tokens}
    for name in ("resent", "extended"):
        out[name]["of_cold"] = out[name]["ttft_s"] / out["cold"]["ttft_s"]
    del llm
    gc.collect()
    return out
