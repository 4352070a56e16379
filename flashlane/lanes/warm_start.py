"""Warm rounds before a server takes requests (`flashlane serve` on CUDA).

The shapes a round meets first pay for themselves: a Triton kernel compiles for each new
specialisation (pieces of several prompts in one round, odd row counts, decode windows in
shared rounds) and the lone driver captures a graph for each new kind of step (the keyed
draw of sampled streams, for each size). On the real FP8 model served on an H200 the first
sixteen requests arriving together met rounds of 4.5-10 s that way (sixteen 128-token
prompts: first tokens after 15-18 s where the rounds themselves take well under one), and
a warm-up request of the benchmark's paid the same at one stream.

So the server runs waves of short requests through the host before it listens: for each
size of the lone driver's steps (1, 2, 4, ... up to the sessions), that many prompts arrive
together, greedy with distinct odd lengths (one of them 1), then sampled with lengths that
are multiples of 16, then sampled with a penalty (adjusted_draw's step), a few tokens each; then
prompts past LONG rows, whose GDN takes the chunked call (fla's kernels on a GPU): several in
one round, one arriving while a reply decodes, cut into pieces by the piece clock, and one a
row past a round's (at 16 streams on the H100 such rounds compiled four of fla's kernels
while serving, 2-3 s each: serve_cuda_h100_eda8d35_*; none since 86fa95a). Replies do not
depend on it (rounds are exact whatever their shapes); what it leaves (the prompt cache, the
piece clock, the host's counters, how drafts landed) is reset after.
"""

from __future__ import annotations

import time

from flashlane.lanes.host import LaneHost
from flashlane.lanes.piece_clock import PieceClock
from flashlane.lanes.stream import DraftStats
from flashlane.request import SamplingParams
from flashlane.sessions.prompt_cache import PromptCache

TOKENS = 4  # reply tokens of a warm request: its first from the prompt round, then steps
# whole prompts up to this many rows take the GDN's recurrent rule, longer ones and pieces
# the chunked call (models/layers/gated_deltanet.SHORT_PROMPT)
LONG = 64
# each wave size's passes: (name, params, length grid): greedy; sampled (the keyed draw);
# penalized, whose steps draw with sampling/adjusted_draw.py (a graph of each size; when the
# host drew them, a served run at 16 compiled kernels while serving: serve_cuda_h100_66fe4d1_*)
WAVES = (
    ("greedy", SamplingParams(max_tokens=TOKENS, temperature=0.0), 1),
    ("sampled", SamplingParams(max_tokens=TOKENS, temperature=1.0), 16),
    ("penalized", SamplingParams(max_tokens=TOKENS, temperature=1.0, presence_penalty=0.5), 1),
)


def wave_sizes(host: LaneHost) -> list[int]:
    """Requests arriving together in each wave: the lone driver's step sizes, else 1, 2, 4,
    ... up to the sessions."""
    n = len(host.sessions.capacities)
    sizes = list(host.lone.sizes) if host.lone is not None else []
    return sorted({min(s, n) for s in sizes} or {min(2**i, n) for i in range(n.bit_length())})


def warm_start(host: LaneHost, vocab_size: int) -> float:
    """Run the warm waves to the end; returns their seconds. The host must be idle."""
    if host.has_work:
        raise ValueError("warm rounds need an idle host")
    started = time.perf_counter()
    budget = host.config.prefill_rows
    longest = host.sessions.max_model_len - TOKENS  # a prompt a session holds with its reply
    try:
        for size in wave_sizes(host):
            if size > host.config.max_queue or longest < 1:
                break
            for name, params, grid in WAVES:
                _wave(host, vocab_size, f"{size}-{name}", params, _lengths(size, budget, grid),
                      longest)  # fmt: skip
        if longest > 3 * LONG + 5:
            _chunked(host, vocab_size, budget, longest)
    finally:  # a wave that failed leaves nothing behind
        for s in (*host.waiting, *host.live):
            host.cancel(s.request_id)
        while host.has_work:
            host.run_once()
    host.cache = PromptCache(host.config.prompt_cache_bytes)
    host.clock = PieceClock(host.config.stall)  # the warm pieces' rounds are not the load's
    host.counts = dict.fromkeys(host.counts, 0)
    _forget_landing(host)
    return time.perf_counter() - started


def _forget_landing(host: LaneHost) -> None:
    """How the warm prompts' drafts landed says nothing of the requests': the shared rounds'
    pool and the lone driver's drafting start afresh (its measured step times stay)."""
    host.core.mtp_pool = DraftStats()
    drafting = getattr(host.lone, "drafting", None)
    if drafting is not None:  # the same object: its absorber's buffers are graphs' inputs
        drafting.restart()


def _wave(host: LaneHost, vocab: int, name: str, params: SamplingParams, lengths, longest: int):
    """Requests (prompts of `lengths`) arriving together, run to their end."""
    for i, length in enumerate(lengths):
        host.submit(f"warm-{name}-{i}", _prompt(i, min(length, longest), vocab), params, seed=i)
    while host.has_work:
        host.run_once()


def _chunked(host: LaneHost, vocab: int, budget: int, longest: int) -> None:
    """Prompts past LONG rows: three whole ones in one round (odd rows in all); one arriving
    while a reply decodes, in pieces on the chunk grid (from a kept state); and, where a
    session holds it, one of a round's rows and one more, whose last piece is a row (Triton
    specialises an integer equal to 1)."""
    lengths = [2 * LONG + 1 + 2 * i for i in range(3)]
    greedy = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    if sum(lengths) <= budget and host.config.max_queue >= 3:
        _wave(host, vocab, "long", greedy, lengths, sum(lengths))
    reply = SamplingParams(max_tokens=LONG, temperature=0.0)
    host.submit("warm-reply", _prompt(7, 8, vocab), reply)
    while host.has_work and all(s.is_filling for s in host.live):
        host.run_once()
    host.submit("warm-beside", _prompt(9, 3 * LONG + 5, vocab), greedy)
    while host.has_work:
        host.run_once()
    if budget + 1 <= longest:
        _wave(host, vocab, "past", greedy, [budget + 1], longest)


def _prompt(i: int, length: int, vocab: int) -> list[int]:
    return [1 + (31 * i + 7 * j) % (vocab - 1) for j in range(length)]


def _lengths(size: int, budget: int, grid: int = 1) -> list[int]:
    """Prompt lengths for `size` requests, together within one round's rows: grid 1, distinct
    odd lengths, the last of several 1; grid 16, multiples of 16 where they fit (Triton
    specialises a kernel's integers on being 1 and on dividing by 16: both kinds compile)."""
    top = max(1, min(63, budget // size - 1))
    if grid == 16 and top >= 16:
        return [16 * (top // 16 - i % (top // 16)) for i in range(size)]
    odd = [max(1, top - 2 * (i % max(1, top // 2))) | 1 for i in range(size)]
    return [*odd[:-1], 1] if size > 1 else odd
