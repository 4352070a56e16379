"""Time to first token with the prompt cache: cold vs resent vs extended by one chat turn.

    python benchmarks/bench_prompt_cache.py [--device cpu] [--tokens 4096] [--repeats 3] [--json]

The model comes from `build_model(device, folder)`: by default a tiny random Flash Next config
(every path: GDN, sparse attention, MoE, PLE, MTP) with a window of 8192 tokens, so a 4k-token
prompt fits one session; swap the function for a size-faithful checkpoint on the GPU. Per
repeat a fresh random prompt is served cold (the cache holds nothing of it; its reply is
`--reply` tokens), then resent (max_tokens 1), then extended by the reply and a new user turn
of `--turn` tokens. TTFT = admission to the first reply token (RequestStats.prefill_seconds),
one request at a time, median over repeats. A cold run on an engine without the cache shows
what cutting pieces at marks and keeping states costs. Every resumed reply is checked against
its fresh run (tokens and logprobs). Prints a table, then one JSON line (with --json, only it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import tempfile
from datetime import date
from pathlib import Path

import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.presets import preset
from flashlane.request import SamplingParams

COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
# The toy Flash Next preset (every path: GDN, sparse attention, MoE, PLE, MTP) with a window
# of 8192 positions.
TINY_8K = dict(preset("flashnext-tiny"), max_position_embeddings=8192)


def build_model(device: str, folder: Path) -> Path:
    """A random checkpoint of TINY_8K in `folder` (no transformers needed); returns the folder."""
    from safetensors.torch import save_file

    from flashlane.models.config import ModelConfig
    from flashlane.models.flashnext import FlashNext
    from flashlane.models.loader import hf_tensors

    torch.manual_seed(0)
    model = FlashNext(ModelConfig.from_hf(TINY_8K))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            else:
                p.normal_(0.0, 0.2 if p.ndim > 1 else 0.3)
    (folder / "config.json").write_text(json.dumps(TINY_8K, indent=2))
    save_file(hf_tensors(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def ttft(llm: LLM, prompt: list[int], params: SamplingParams):
    out = llm.generate(prompt, params)[0]
    assert out.error is None, out.error
    return out.stats.prefill_seconds, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length")
    ap.add_argument("--reply", type=int, default=32, help="reply tokens of the cold turn")
    ap.add_argument("--turn", type=int, default=64, help="tokens of the next user turn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    say = (lambda *a: None) if args.json else print
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.device, Path(tmp))
        kw = dict(costs=COSTS, parallel=2, device=args.device)
        llm = LLM(str(path), **kw)
        plain = LLM(str(path), prompt_cache_gb=0, **kw)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(1)
    greedy = SamplingParams(max_tokens=args.reply, temperature=0.0, ignore_eos=True, logprobs=0)
    first = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    times: dict[str, list[float]] = {"cold_no_cache": [], "cold": [], "resent": [], "extended": []}
    cached: dict[str, int] = {}
    exact = True
    for _ in range(args.repeats):
        prompt = torch.randint(3, vocab, (args.tokens,), generator=g).tolist()
        t, ref = ttft(plain, prompt, greedy)
        times["cold_no_cache"].append(t)
        t, cold = ttft(llm, prompt, greedy)
        times["cold"].append(t)
        exact &= cold.token_ids == ref.token_ids and cold.logprobs == ref.logprobs
        t, again = ttft(llm, prompt, first)
        times["resent"].append(t)
        exact &= again.token_ids == ref.token_ids[:1] and again.logprobs == ref.logprobs[:1]
        turn = torch.randint(3, vocab, (args.turn,), generator=g).tolist()
        extended = [*prompt, *cold.token_ids, *turn]
        t, ext = ttft(llm, extended, first)
        times["extended"].append(t)
        _, want = ttft(plain, extended, first)
        exact &= ext.token_ids == want.token_ids and ext.logprobs == want.logprobs
        cached = {"resent": again.stats.cached_tokens, "extended": ext.stats.cached_tokens}
    med = {k: statistics.median(v) for k, v in times.items()}
    say(f"prompt {args.tokens} tokens, {args.device}, median of {args.repeats}")
    say(f"{'run':>14} {'TTFT ms':>9} {'x cold':>7} {'cached':>7}")
    for k, v in med.items():
        say(f"{k:>14} {v * 1e3:>9.1f} {v / med['cold']:>7.3f} {cached.get(k, 0):>7}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    cache = llm.engine.host.cache
    device = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    print(
        json.dumps(
            {
                "bench": "prompt_cache",
                "date": str(date.today()),
                "commit": commit,
                "device": device,
                "model": "tiny random qwen4_exp, window 8192 (build_model)",
                "prompt_tokens": args.tokens,
                "reply_tokens": args.reply,
                "turn_tokens": args.turn,
                "ttft_ms": {k: round(v * 1e3, 2) for k, v in med.items()},
                "ttft_ms_all": {k: [round(x * 1e3, 2) for x in v] for k, v in times.items()},
                "resent_over_cold": med["resent"] / med["cold"],
                "extended_over_cold": med["extended"] / med["cold"],
                "cached_tokens": cached,
                "cache_bytes": cache.num_bytes,
                "cache_entries": len(cache.entries),
                "exact": exact,
                "command": "python benchmarks/bench_prompt_cache.py "
                + " ".join(
                    f"--{k} {v}" for k, v in vars(args).items() if v is not None and k != "json"
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
