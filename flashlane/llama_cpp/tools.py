"""llama.cpp's own benchmarks, run on a GGUF and read back.

Decode: llama-batched-bench, N sequences of a --prompt-len prompt of random ids, then
--decode-tokens steps of N tokens each; S_TG = N x tokens / the steps' time, our tok/s's
definition. Each N runs twice in one process and the second is kept, so first-shape costs (CUDA
graph capture, kernel loading) stay out, as our warm-up keeps them out of ours.
Prefill: llama-bench pp<L>, one prompt of L tokens, the mean over its repetitions.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from flashlane.llama_cpp.build import LlamaBuild


def _run(cmd: list[str], timeout: float) -> str:
    t0 = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"{Path(cmd[0]).name} exited {done.returncode}:\n" + "\n".join(tail))
    print(f"[{time.strftime('%H:%M:%S')}] done in {time.perf_counter() - t0:.0f} s", flush=True)
    return done.stdout + "\n" + done.stderr


def gpu_flags(gpu: bool, threads: int | None) -> list[str]:
    return ["-ngl", "999" if gpu else "0", *(["-t", str(threads)] if threads else [])]


def decode(
    build: LlamaBuild,
    gguf: Path,
    streams: list[int],
    prompt_len: int,
    tokens: int,
    gpu: bool,
    threads: int | None = None,
    timeout: float = 600,
) -> dict:
    """{"command": ..., "decode": {N: {"tok_s", "round_ms", "prompt_tok_s"}}} at each N."""
    order = [n for n in streams for _ in range(2)]
    cmd = [str(build.tool("llama-batched-bench")), "-m", str(gguf),
           "-c", str(max(streams) * (prompt_len + tokens)), "-b", "2048", "-ub", "512",
           "-npp", str(prompt_len), "-ntg", str(tokens), "-npl", ",".join(map(str, order)),
           "--output-format", "jsonl", *gpu_flags(gpu, threads)]  # fmt: skip
    rows = [
        json.loads(line)
        for line in _run(cmd, timeout).splitlines()
        if line.startswith("{") and '"speed_tg"' in line
    ]
    out = {}
    for r in rows:  # a later row of the same N replaces the first
        out[r["pl"]] = {
            "tok_s": r["speed_tg"],
            "round_ms": 1e3 * r["t_tg"] / r["tg"],
            "prompt_tok_s": r["speed_pp"],
            "flash_attn": r["flash_attn"],
        }
    missing = [n for n in streams if n not in out]
    if missing:
        raise RuntimeError(f"llama-batched-bench gave no row for {missing} streams")
    return {"command": cmd, "decode": {n: out[n] for n in streams}}


def prefill(
    build: LlamaBuild,
    gguf: Path,
    lengths: list[int],
    gpu: bool,
    threads: int | None = None,
    repeats: int = 3,
    timeout: float = 600,
) -> dict:
    """{"command": ..., "prefill": {L: {"tok_s", "ttft_s", "stddev_tok_s"}}, "build_commit",
    "build_number", "backends", "gpu_info"} from llama-bench's JSON."""
    cmd = [str(build.tool("llama-bench")), "-m", str(gguf), "-p", ",".join(map(str, lengths)),
           "-n", "0", "-r", str(repeats), "-o", "json", *gpu_flags(gpu, threads)]  # fmt: skip
    text = _run(cmd, timeout)
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end < start:
        raise RuntimeError("llama-bench printed no JSON")
    tests = json.loads(text[start : end + 1])
    out = {"command": cmd, "prefill": {}}
    for t in tests:
        out["prefill"][t["n_prompt"]] = {
            "tok_s": t["avg_ts"],
            "ttft_s": t["avg_ns"] / 1e9,
            "stddev_tok_s": t["stddev_ts"],
        }
    if tests:
        out.update(
            {
                k: tests[0].get(k)
                for k in (
                    "build_commit",
                    "build_number",
                    "backends",
                    "gpu_info",
                    "flash_attn",
                    "n_ubatch",
                )
            }
        )
    return out
