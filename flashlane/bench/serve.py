"""`flashlane bench serve`: served throughput and latency against a running server.

Conventions are vLLM's `bench serve`: TTFT = time to the first streamed chunk that carries
text; TPOT = (E2E - TTFT) / (output tokens - 1); ITL = the gaps between streamed chunks (a chunk
may carry several tokens when drafts land); output tok/s = output tokens / the level's
duration. Prompts are random words cut to exactly --input-len tokens by --tokenizer, here (no
server's /tokenize: llama-server's takes other fields), and sent as token ids; replies run to
--output-len tokens (ignore_eos). A stream that ends before `data: [DONE]` (a dropped
connection) or runs past --timeout is that request's error, never a hang. Greedy unless --seed
is given, then seeded sampling (temperature 1, seed S + prompt index); --extra-body adds
fields (penalties, top_p) to every request. Either way each reply is reproducible, which
--check-alone verifies against the same request sent alone. With
--request-rate, requests arrive as a Poisson process (vLLM's), each level still capped at its
concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from flashlane.bench.client import Result, compared, send
from flashlane.bench.serve_report import plot, print_table, summarize
from flashlane.flags import FlagParser
from flashlane.options import json_object

EMBEDDED = Path(__file__).resolve().parent.parent / "default_model"

WORDS = ["time", "year", "river", "stone", "light", "music", "garden", "window", "answer"]
WORDS += ["story", "letter", "market", "energy", "system", "paper", "world", "number"]


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json, or a folder holding one (the server's model folder)."""
    path = Path(path)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))


def make_prompts(tokenizer: Tokenizer, args: argparse.Namespace) -> list[list[int]]:
    """num_prompts distinct prompts of exactly input_len tokens."""
    rng = random.Random(args.seed if args.seed is not None else 0)
    prompts = []
    for _ in range(args.num_prompts):
        ids: list[int] = []
        while len(ids) < args.input_len:
            text = " ".join(rng.choice(WORDS) for _ in range(args.input_len + 8))
            more = tokenizer.encode(text, add_special_tokens=False).ids
            if not more:
                raise ValueError("bench serve: the tokenizer gives no ids for the prompt words")
            ids += more
        prompts.append(ids[: args.input_len])
    return prompts


def request_body(args: argparse.Namespace, model: str, prompt: list[int], i: int) -> dict:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        # replies compared by their ids (a random model's ids may decode to no text); a
        # server without the field ignores it (llama-server) or says so
        "return_token_ids": True,
    }
    if args.seed is None:
        body["temperature"] = 0.0
    else:
        body.update(temperature=1.0, seed=args.seed + i)
    body.update(args.extra_body or {})
    return body


async def run_level(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    model: str,
    prompts: list[list[int]],
    concurrency: int,
) -> tuple[list[Result], float]:
    """Sends every prompt with at most `concurrency` in flight; returns results and duration.
    With a finite --request-rate, request i arrives at its Poisson time (exponential gaps of
    mean 1/rate, seeded) and waits for a free slot: its TTFT counts that wait, as vLLM's."""
    gate = asyncio.Semaphore(concurrency)
    done = 0
    arrivals = poisson_arrivals(len(prompts), args.request_rate, args.seed)

    async def one(i: int) -> Result:
        nonlocal done
        await asyncio.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        async with gate:
            body = request_body(args, model, prompts[i], i)
            result = await send(client, args.url, body, args.timeout)
        done += 1
        _progress(f"concurrency {concurrency}", done, len(prompts))
        return result

    start = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return list(results), time.perf_counter() - start


def poisson_arrivals(n: int, rate: float, seed: int | None) -> list[float]:
    """n arrival times in seconds from 0: all at 0 for an infinite rate, else cumulative
    exponential gaps of mean 1 / rate (seeded, so levels and runs see the same times)."""
    if rate == float("inf"):
        return [0.0] * n
    rng, t, out = random.Random(0 if seed is None else seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    bar = "#" * filled + "." * (width - filled)
    end = "\n" if done == total else ""
    print(f"\r{label:>16} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def differs(index: int, r: Result, alone: tuple | None) -> dict[str, Any] | None:
    """None when reply `index` equals its alone reply; else where they part: the first
    differing token (or character) and both lengths, for the log."""
    if r.ok and alone is not None and compared(r) == alone:
        return None
    if not r.ok or alone is None:
        return {"prompt": index, "error": r.error or "the alone request failed"}
    got, want = compared(r)[1], alone[1]
    first = next((j for j, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return {"prompt": index, "first": first, "len": len(got), "alone_len": len(want)}


async def served_model(client: httpx.AsyncClient, args: argparse.Namespace) -> str:
    """--model, else the first id /v1/models lists once the server answers: one still loading
    says 503, so ask again each second up to --ready-check-timeout-sec (vLLM's flag)."""
    if args.model:
        return args.model
    deadline = time.monotonic() + args.ready_check_timeout_sec
    while True:
        try:
            r = await client.get(f"{args.url}/v1/models")
            data = r.json().get("data") if r.status_code == 200 else None
            if data:
                return data[0]["id"]
            last = f"HTTP {r.status_code}" + ("" if data is None else ", no model listed")
        except (httpx.TransportError, ValueError) as err:
            last = type(err).__name__
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(
                f"bench serve: {args.url} was not ready within "
                f"{args.ready_check_timeout_sec:g} s (/v1/models: {last})"
            )
        await asyncio.sleep(min(1.0, left))


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(levels) + 4, max_keepalive_connections=max(levels))
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as client:
        model = await served_model(client, args)
        prompts = make_prompts(load_tokenizer(args.tokenizer), args)
        if args.warmup:
            await run_level(client, args, model, prompts[:1], 1)
        alone = None
        if args.check_alone:
            alone_results, _ = await run_level(client, args, model, prompts, 1)
            alone = [compared(r) if r.ok else None for r in alone_results]
        rows = []
        for level in levels:
            results, duration = await run_level(client, args, model, prompts, level)
            row = summarize(level, results, duration)
            if alone is not None:
                differ = [differs(i, r, a) for i, (r, a) in enumerate(zip(results, alone))]
                differ = [d for d in differ if d is not None]
                row["alone_mismatches"] = len(differ)
                row["alone_differ"] = differ[:16]
            rows.append(row)
    return {
        "url": args.url,
        "model": model,
        "num_prompts": args.num_prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "seed": args.seed,
        "extra_body": args.extra_body,
        "request_rate": None if args.request_rate == float("inf") else args.request_rate,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "levels": rows,
    }


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="flashlane bench serve",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated levels")
    p.add_argument("--num-prompts", type=int, default=32, help="requests a level")
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrivals, requests a second (inf: all at once), each level "
        "capped at its concurrency",
    )
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens a request")
    p.add_argument("--output-len", type=int, default=128, help="reply tokens a request")
    p.add_argument("--seed", type=int, default=None, help="seeded sampling instead of greedy")
    p.add_argument(
        "--extra-body",
        type=json_object,
        default=None,
        help="JSON fields added to every request, e.g. '{\"frequency_penalty\": 0.5}'",
    )
    p.add_argument(
        "--tokenizer",
        default=str(EMBEDDED),
        help="tokenizer.json or its folder, the served model's",
    )
    p.add_argument(
        "--check-alone",
        action="store_true",
        help="every concurrent reply must equal the same request sent alone",
    )
    p.add_argument(
        "--model", default=None, help="the model id to ask for (None: the first of /v1/models)"
    )
    p.add_argument("--api-key", default=None, help="Bearer key, if the server asks one")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument(
        "--ready-check-timeout-sec",
        type=float,
        default=600.0,
        help="how long to wait for a server still loading (503) to list its model",
    )
    p.add_argument("--warmup", type=int, default=1, help="send one request first (0: no)")
    p.add_argument("--output-json", default=None, help="write the results here too")
    p.add_argument("--plot", default=None, help="PNG of tok/s against concurrency")
    return p


def bench_serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    result = asyncio.run(bench(args))
    print_table(result["levels"])
    if args.plot and not plot(result["levels"], args.plot):
        print(
            "matplotlib is not installed: no plot (pip install 'flashlane[bench]')", file=sys.stderr
        )
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    print(json.dumps(result))
    failed = any(r["errors"] or r.get("alone_mismatches") for r in result["levels"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(bench_serve_main(sys.argv[1:]))
