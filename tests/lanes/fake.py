"""A fake Backend for lane-core tests: its "model" is a deterministic function of the history.

`model(history, seed)` gives the next token (seed None: greedy), so serial decoding is well
defined and any drafted or batched run must reproduce it. The fake holds each stream's fed
tokens, checks every window against them (start, draws, session, rows), and raises `Violation`
(a BaseException, so the lane core's error handling cannot swallow it) on a broken contract.
Errors and wrong drafts are injected on demand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from flashlane.lanes.core import LaneConfig
from flashlane.lanes.host import HostConfig, LaneHost
from flashlane.lanes.outputs import output
from flashlane.lanes.records import CostTable, Drafts, Verdict, Window
from flashlane.lanes.stops import StopRules
from flashlane.request import RequestOutput

Model = Callable[[Sequence[int], "int | None"], int]

# Token ids: 0..9 are free for tests (eos), the models emit 10..79, 90..99 are thinking marks.
FIRST_ID, NUM_IDS = 10, 70
FLAT_COSTS = CostTable({n: 10.0 + 0.5 * n for n in range(1, 65)}, 0.5, 1.0)


class Violation(BaseException):
    """The lane core broke the Backend protocol."""


def hash_model(history: Sequence[int], seed: int | None) -> int:
    h = 1469598103934665603
    for t in history[-3:]:
        h = ((h ^ t) * 1099511628211) % 2**64
    if seed is not None:
        h = ((h ^ seed ^ (len(history) << 20)) * 1099511628211) % 2**64
    return FIRST_ID + (h >> 17) % NUM_IDS


def copy_model(history: Sequence[int], seed: int | None) -> int:
    """Continues the most recent earlier occurrence of the last two tokens, else hashes."""
    n = len(history)
    for j in range(n - 2, 1, -1):
        if history[j - 2] == history[n - 2] and history[j - 1] == history[n - 1]:
            return history[j]
    return hash_model(history, seed)


def serial(model: Model, prompt: Sequence[int], seed: int | None, num_tokens: int) -> list[int]:
    history = list(prompt)
    for _ in range(num_tokens):
        history.append(model(history, seed))
    return history[len(prompt) :]


@dataclass
class FakeBackend:
    model: Model = hash_model
    capacities: Sequence[int] = (4096,) * 16
    cost_table: CostTable = FLAT_COSTS
    max_rows: int = 64
    # (stream_id, draft call index) -> index of the draft to make wrong, or None
    wrong: Callable[[int, int], int | None] = lambda stream_id, call: None
    draft_prob: float = 0.9
    fail_verdicts: set[int] = field(default_factory=set)  # streams whose next verdict fails
    fail_drafts: set[int] = field(default_factory=set)  # streams whose next Drafts fail
    fail_next: str | None = None  # "verify" | "keep" | "draft": the next such call raises
    fed: dict[int, list[int]] = field(default_factory=dict)
    session_of: dict[int, int] = field(default_factory=dict)
    widths: list[list[int]] = field(default_factory=list)  # decode window rows per verify
    released: list[tuple[int, bool]] = field(default_factory=list)
    draft_calls: dict[int, int] = field(default_factory=dict)
    _last: list[Window] = field(default_factory=list)
    _draws: dict[int, object] = field(default_factory=dict)

    def costs(self) -> CostTable:
        return self.cost_table

    def verify(self, windows: Sequence[Window]) -> list[Verdict]:
        self._check_batch(windows)
        if self._take_failure("verify"):
            raise RuntimeError("injected verify failure")
        self._last = list(windows)
        self.widths.append([w.num_rows for w in windows if w.kind == "decode"])
        return [self._verdict(w) for w in windows]

    def keep(self, kept: Mapping[int, int]) -> None:
        last = {w.stream_id: w for w in self._last}
        for stream_id, rows in kept.items():
            w = last.get(stream_id)
            if w is None or not 1 <= rows <= w.num_rows:
                raise Violation(f"keep {stream_id}: {rows} rows of {w}")
            if w.kind == "prompt" and rows != w.num_rows:
                raise Violation(f"a prompt piece keeps all its rows, not {rows}")
        if self._take_failure("keep"):
            raise RuntimeError("injected keep failure")
        for stream_id, rows in kept.items():
            self.fed[stream_id].extend(last[stream_id].tokens[:rows])
        self._last = []

    def draft(self, depths: Mapping[int, int]) -> list[Drafts]:
        if self._take_failure("draft"):
            raise RuntimeError("injected draft failure")
        return [self._drafts(stream_id, depth) for stream_id, depth in depths.items()]

    def move(self, stream_id: int, session_id: int) -> None:
        if session_id in self.session_of.values():
            raise Violation(f"move of {stream_id} into busy session {session_id}")
        self.session_of[stream_id] = session_id

    def release(self, stream_id: int, keep_prompt_state: bool) -> None:
        self.fed.pop(stream_id, None)
        self.session_of.pop(stream_id, None)
        self._draws.pop(stream_id, None)
        self.released.append((stream_id, keep_prompt_state))

    def _take_failure(self, call: str) -> bool:
        if self.fail_next == call:
            self.fail_next = None
            return True
        return False

    def _check_batch(self, windows: Sequence[Window]) -> None:
        ids = [w.stream_id for w in windows]
        if not windows or len(set(ids)) != len(ids):
            raise Violation(f"an empty batch or a stream twice: {ids}")
        if sum(w.num_rows for w in windows if w.kind == "decode") > self.max_rows:
            raise Violation("too many rows")
        for w in windows:
            self._check_window(w)

    def _check_window(self, w: Window) -> None:
        if not w.tokens:
            raise Violation(f"empty window for {w.stream_id}")
        bound = self.session_of.setdefault(w.stream_id, w.session_id)
        others = [s for s, sess in self.session_of.items() if sess == w.session_id]
        if bound != w.session_id or others != [w.stream_id]:
            raise Violation(f"stream {w.stream_id} in session {w.session_id}, bound {bound}")
        if w.start + w.num_rows > self.capacities[w.session_id]:
            raise Violation(f"window past the context of session {w.session_id}")
        fed = self.fed.setdefault(w.stream_id, [])
        if w.start != len(fed):
            raise Violation(f"stream {w.stream_id} window at {w.start}, fed {len(fed)}")
        d = w.draws
        seen = list(d.prompt_ids) + list(d.reply_ids)
        if w.kind == "decode" and seen != [*fed, w.tokens[0]]:
            raise Violation(f"stream {w.stream_id}: draws do not match the fed tokens")
        if w.kind == "prompt" and seen[: w.start + w.num_rows] != [*fed, *w.tokens]:
            raise Violation(f"stream {w.stream_id}: prompt piece does not match its prompt")
        self._draws[w.stream_id] = d

    def _verdict(self, w: Window) -> Verdict:
        if w.stream_id in self.fail_verdicts:
            self.fail_verdicts.discard(w.stream_id)
            return Verdict(w.stream_id, [], None, "injected stream failure")
        history = list(self.fed[w.stream_id])
        seed = w.draws.seed if w.draws.params.temperature > 0 else None
        sampled = []
        for r, token in enumerate(w.tokens):
            history.append(token)
            if w.kind == "decode" or (w.last_piece and r == w.num_rows - 1):
                sampled.append(self.model(history, seed))
        logprobs = [{t: -0.5} for t in sampled] if w.draws.params.logprobs is not None else None
        return Verdict(w.stream_id, sampled, logprobs)

    def _drafts(self, stream_id: int, depth: int) -> Drafts:
        call = self.draft_calls.get(stream_id, 0)
        self.draft_calls[stream_id] = call + 1
        if stream_id in self.fail_drafts:
            self.fail_drafts.discard(stream_id)
            return Drafts(stream_id, [], [], "injected draft failure")
        d = self._draws[stream_id]
        seed = d.seed if d.params.temperature > 0 else None
        history = [*self.fed[stream_id], d.reply_ids[-1]]
        tokens = []
        for _ in range(depth):
            tokens.append(self.model(history + tokens, seed))
        bad = self.wrong(stream_id, call)
        if bad is not None and bad < len(tokens):
            tokens[bad] = FIRST_ID + (tokens[bad] - FIRST_ID + 1) % NUM_IDS
        return Drafts(stream_id, tokens, [self.draft_prob] * len(tokens))


def make_host(
    backend: FakeBackend, rules=None, num_sessions: int = 4, grow: int = 64, **lanes
) -> LaneHost:
    """A host over `backend` with `num_sessions` sessions of its capacity; `lanes` and a few
    host fields (max_queue, prefill_rows, decode_share, stall) override the defaults."""
    names = ("max_queue", "prefill_rows", "decode_share", "stall")
    host_fields = {k: lanes.pop(k) for k in names if k in lanes}
    config = HostConfig(LaneConfig(**lanes), **host_fields)
    capacities = list(backend.capacities[:num_sessions])
    return LaneHost(backend, config, rules or StopRules(), capacities, grow)


def run_to_end(host: LaneHost, max_rounds: int = 10_000) -> dict[str, RequestOutput]:
    """Rounds until the host is idle; the final output of every request that ended."""
    outputs: dict[str, RequestOutput] = {}
    for _ in range(max_rounds):
        if not host.has_work:
            return outputs
        for update in host.run_once():
            if update.finish is not None:
                outputs[update.stream.request_id] = output(update.stream)
    raise AssertionError("the host did not finish")


def alone(backend_args: dict, prompt, params, rules=None, **lanes) -> RequestOutput:
    """The request served by itself on a fresh host."""
    host = make_host(FakeBackend(**backend_args), rules, **lanes)
    host.submit("alone", prompt, params)
    return run_to_end(host)["alone"]
