"""Drafted lone steps: when a call of the lone driver drafts (`Drafting.choose`) and the
drafted decode loop (`Drafting.decode`); a drafted step and its buffers are
runner/draft_step.py's.

A drafted step of depth K verifies each session's pending token and K drafts in one step and
makes the next K drafts on the device (runner/draft_step.py). No host value enters a step, so
one CUDA graph per (K, batch size) replays it for any sessions, named by the size tables from
the anchor session (runner/lone_buffers.py), two in flight, as plain lone steps do
(runner/lone.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from flashlane.drafting.mtp import Waiting
from flashlane.lanes.stream import DraftStats
from flashlane.runner import lone
from flashlane.runner.absorb import Absorber
from flashlane.runner.draft_prices import Prices
from flashlane.runner.draft_step import DraftBuffers, priced
from flashlane.runner.graphs import bucket_of

DEPTH = 2  # drafts a drafted step carries (the embedded model lands ~3 in 4 at depth 1)
PROBE_EVERY = 8  # calls before a try of the kind measured slower (landing drifts with text)
MAX_PROBE_EVERY = 128  # the gap doubles while each try confirms the measures, up to this
PROBE_STEPS = 8  # steps a try of either kind runs: enough to measure (run_steps folds from 4)
# drafts measured at depth 1 before a verdict against drafting waits PROBE_EVERY calls; until
# then drafting is tried again every UNSURE_EVERY calls. One try's seven measured steps
# landed 2 of 7 on the H200 (63de559), where the same replies' later steps landed 0.56: that
# verdict kept one stream on plain steps for eight calls (benchmarks/draft_choices.py)
SURE_DRAFTS = 32
UNSURE_EVERY = 2
# streams whose landing is kept (Drafting.replies; the fewest that tell a spread and
# STREAM_PRIOR are draft_prices.py's), and the drafts a stream must have offered to count
# among them (a try's seven measured steps do)
REPLIES, REPLY_DRAFTS = 64, PROBE_STEPS // 2
# the most sessions a drafted step takes: past it a step's B*(K+1) rows read most experts,
# and 16 lost in every run measured (0.82-0.95 on / off, H100 and H200, 63de559-6d98ca5:
# the price of its slowest reply, from a try's 7 drafts, was too hopeful)
MAX_STREAMS = 8
# drafted steps of up to this many sessions (that fit) are captured at engine start; larger
# ones when first chosen. At 4, a 16-stream batch's tail of 5 captured its size mid-reply
# (H100, 635fac4: a 9-step call took 49.8 ms; benchmarks/round_trace.py)
EAGER_STREAMS = MAX_STREAMS


class Drafting(Prices):
    """The lone driver's drafted steps: whether a call drafts (`choose`) and the drafted
    decode loop (`decode`), two steps in flight as plain ones."""

    def __init__(self, driver: lone.LoneDriver, depth: int = DEPTH):
        self.driver, self.depth = driver, depth
        # a call's load: its streams' waiting cells into their heads, graphed by bucket (the
        # driver's absorb graphs read these buffers: they live as long as the driver)
        self.absorber = Absorber(driver)
        self.restart()

    def restart(self) -> None:
        """Forget every measure, landing and carry (the server's warm rounds say nothing of
        its requests', lanes/warm_start.py); the absorber stays. A new Drafting in its place
        (8bcbebb) dropped the buffers the driver's absorb graphs were captured on (they are
        found by bucket, 27c44d8), so a drafted call's absorb read a freed table: `flashlane
        serve` on the H100 at 1670cd1 met an illegal memory access at its first request."""
        self.stats = DraftStats()  # landing per depth over every drafted step
        self.by_stream: dict[int, DraftStats] = {}  # the same, of each stream's own steps
        # stream id -> expected tokens a drafted step by its own landing at its latest drafted
        # call, of the last REPLIES streams (`_slowest`; ended or not: slow replies end plain)
        self.replies: dict[int, float] = {}
        self.num_calls = 0
        self.num_drafted = self.num_landed = 0
        self.landed: list[int] = []  # drafts landed per session in the last call
        self.live_steps: list[int] = []  # its steps per session before its take said no
        self.num_carried = 0  # calls that went on from the device's drafts (`carry`)
        # stream id -> ((session, position, pending token), buffers, row): where a drafted
        # call left the stream's pending token and drafts on the device; a later call from
        # there (with these streams or a few of them) takes them over without the host
        self.carry: dict[int, tuple[tuple[int, int, int], DraftBuffers, int]] = {}
        self.best: int | None = None  # the kind the measures chose last
        self.probe_every = self.until_probe = PROBE_EVERY
        self.probing = False  # this call tries the kind measured slower (or unmeasured)
        self.tried: list | None = None  # a drafted try's replies' tokens left (`_goes_on`)
        self.verdict: dict = {}  # the last prices (ms a token), slowest and depth chosen

    def choose(
        self,
        ids: list[int],
        budget: int | None = None,
        left: int | list[int] | None = None,
        carried: bool = False,
        stream_ids: list[int] | None = None,
    ) -> int:
        """The depth, or 0 (plain steps), for a call of these sessions of up to `budget`
        steps for replies that want `left` more tokens (one count or one each; None: as
        many as the steps give): drafts while a drafted call's tokens cost fewer ms each
        than a plain call's (`draft_step.priced`: measured step and load ms, a drafted step
        1 + its expected landed drafts, each call as long as its slowest reply), and with
        every reply's tokens known, only if the replies end sooner drafted (`_slowest`). The
        kind measured slower is tried after PROBE_EVERY calls (the gap doubling while tries
        confirm it), drafting every UNSURE_EVERY calls while fewer than SURE_DRAFTS drafts
        are measured. `carried`: a drafted call loads as a plain one (`carry_of`). More
        than MAX_STREAMS, or more rows than the plan's (`fits`): plain."""
        self.num_calls += 1
        self.probing, self.verdict = False, {}
        if len(ids) > MAX_STREAMS or not self.fits(len(ids)):
            return 0
        stream_ids = stream_ids or [None] * len(ids)
        steps, lefts = budget or self.driver.max_steps, _lefts(left, len(ids))
        return self._better(len(ids), steps, lefts, stream_ids, carried)

    def run(
        self, ids, tokens, positions, budget, room, takes, stream_ids, draws, hints=None,
        left=None, ends=any,
    ):  # fmt: skip
        """LoneDriver.decode_drafted: `decode` where `choose` drafts -> (drafts made, drafts
        landed), per session in the steps before its take said no; None: plain steps
        (nothing ran). A plain try runs here, PROBE_STEPS steps; a drafted one goes on past
        them while its own steps' landing says drafting pays (`_goes_on`)."""
        carried = self.carry_of(stream_ids, ids, positions, tokens) is not None
        depth = self.choose(ids, budget, left, carried, stream_ids)
        self.tried = _lefts(left, len(ids)) if self.probing and depth else None
        if self.probing and not depth:
            budget = min(budget, PROBE_STEPS)
        if not depth:
            if not self.probing:
                return None
            self.driver.decode_many(ids, tokens, positions, budget, takes, stream_ids, draws, ends)
            return [0] * len(ids), [0] * len(ids)
        args = (ids, tokens, positions, budget, room, takes, stream_ids, draws, hints, ends)
        if self.decode(*args, left=left) is None:
            return None
        return [n * depth for n in self.live_steps], list(self.landed)

    def eager_sizes(self) -> list[int]:
        """The sizes whose drafted step is captured at engine start (those that fit)."""
        return [n for n in self.driver.sizes if n <= EAGER_STREAMS and self.fits(n)]

    def fits(self, b: int) -> bool:
        """Whether a drafted step of b sessions holds no more rows than the plan's rows a
        round (driver.max_rows): B*(K+1) of the size that holds b where steps are graphed.
        A step keeps each GDN layer's state after every row until it commits (3 MiB a row
        and layer for the full Flash Next: 5.2 GiB for 16 sessions at depth 2), in the
        driver's graph pool, beside the plan's verify scratch for as many rows."""
        drv = self.driver
        if drv.max_rows is None:
            return True
        size = (bucket_of(b, drv.sizes) or b) if drv.use_graphs else b
        return size * (self.depth + 1) <= drv.max_rows

    def _better(self, b, steps, lefts, stream_ids, carried: bool = False) -> int:
        expected, drv = self._expected(stream_ids), self.driver
        near, plain, drafted = self._measured(b)
        if drafted is None or plain is None:
            self.probing = drafted is None  # a drafted try: its steps measure it
            return 0 if drafted is not None else self.depth
        loads = [drv.load_ms.get((near, d), 0.0) for d in (0, self.depth)]
        if carried:  # no absorb: the plain call's load stands in (run_steps folds none)
            loads[1] = loads[0]
        plain_ms = round(priced(loads[0], plain, steps, lefts, [1.0] * b), 4)
        drafted_ms = round(priced(loads[1], drafted, steps, lefts, expected), 4)
        better = self.depth if drafted_ms < plain_ms else 0
        slowest = guessed = None
        if better and max(lefts) < math.inf:  # and the replies end sooner drafted
            slowest, guessed = self._slowest(stream_ids, lefts, expected)
            gain = loads[0] + max(lefts) * plain - (loads[1] + slowest * drafted)
            if gain <= (loads[1] if guessed else 0.0):
                better = 0
        self.verdict = dict(plain=plain_ms, drafted=drafted_ms, slowest=slowest, better=better)
        if better and guessed:  # a try first: its steps measure the new streams' own landing
            self.probing = True
            return better
        if better != self.best:  # the measures changed their mind: try the other kind soon
            self.best, self.probe_every = better, PROBE_EVERY
            self.until_probe = min(self.until_probe, PROBE_EVERY)
        if not better and sum(self.stats.offered[:1]) < SURE_DRAFTS:  # a landing guessed
            self.until_probe = min(self.until_probe, UNSURE_EVERY)
        self.until_probe -= 1
        if self.until_probe > 0:
            return better
        self.probing = True
        self.probe_every = self.until_probe = min(2 * self.probe_every, MAX_PROBE_EVERY)
        return self.depth - better

    def decode(
        self,
        ids: list[int],
        tokens: list[int],
        positions: list[int],
        budget: int,
        room: int,
        takes: list[Callable[[int, bool], bool]],
        stream_ids: list[int],
        draws: list,
        hints: list[list[int]] | None = None,
        ends: Callable[[list[bool]], bool] = any,
        left: list[int] | int | None = None,
    ) -> int | None:
        """LoneDriver.decode_many in drafted steps: up to `budget` steps while each fits in
        `room` positions; every landed step's kept tokens go to the takes in order, and the
        call ends once `ends` says so of which takes have said no (default: any). `hints`:
        each stream's guesses at its next tokens (copy drafts) for the first step, where no
        earlier drafted call left drafts on the device. `left`: the tokens each reply still
        wants (run's); while the step in flight may end the call, none is launched past it.
        Returns the steps launched (None: no step fits, nothing ran)."""
        drv, depth = self.driver, self.depth
        started = drv.clock()
        t = depth + 1
        budget = min(budget, room // t, drv.max_steps)
        if drv.size_tables is not None:  # the pad rows' room, from position 0
            budget = min(budget, drv.size_tables.pad.capacity // t - 1)
        if budget <= 0:
            return None
        b = len(ids)
        io = drv.buffers(b, depth)
        if io.table is not None:  # rows past b: the pad session's
            io.table.copy_(drv.size_tables.of(tuple(ids), io.size, depth), non_blocking=True)
        # sessions whose first step has no drafts but padding: it tells nothing of landing
        carry = self.carry_of(stream_ids, ids, positions, tokens, io.depth)
        blind = self._load(io, ids, tokens, positions, stream_ids, hints, carry)
        kept, last, done, steps = [0] * b, list(tokens), [False] * b, [0]
        tried, self.tried = self.tried, None  # this call's (run's), not a later one's
        if len(self.by_stream) > 4 * MAX_STREAMS:  # ended replies' go (theirs ended with them)
            self.by_stream = {
                sid: self.by_stream[sid] for sid in stream_ids if sid in self.by_stream
            }
        own = [self.by_stream.setdefault(sid, DraftStats()) for sid in stream_ids]
        self.landed, self.live_steps = [0] * b, [0] * b

        def land(rows: list[list[int]]) -> bool:
            steps[0] += 1
            for i, row in enumerate(rows[:b]):
                n = row[2 * t]
                kept[i] += n
                last[i] = row[n - 1]
                if i not in blind:  # the device's own chain: a measure of landing
                    self.stats.record([1.0] * depth, n - 1)
                    own[i].record([1.0] * depth, n - 1)
                    self.num_drafted += depth
                    self.num_landed += n - 1
                if not done[i]:  # a stream done before this step rides along
                    self.landed[i] += n - 1
                    self.live_steps[i] += 1
                said = [takes[i](row[j], bool(row[t + j])) for j in range(n)]
                done[i] = not all(said) or done[i]
            blind.clear()  # from the second step on, the device's chain drafts
            if tried is not None and steps[0] == PROBE_STEPS:  # a drafted try
                lefts = [max(0, left - k) for left, k in zip(tried, kept)]
                if not self._goes_on(b, budget - steps[0], lefts, stream_ids):
                    return False
            return not ends(done)

        lefts = _lefts(left, b)

        def near() -> bool:  # the step in flight lands up to t tokens a stream
            return ends([d or n - k <= t for d, n, k in zip(done, lefts, kept)])

        # a carried call's load (device copies) would understate the absorbing calls'
        launched = drv.run_steps(tuple(ids), io, budget, land, started, carry is None, near)
        for sid, stats in zip(stream_ids, own):  # each stream's landing so far, the latest
            if sum(stats.offered[:1]) >= REPLY_DRAFTS:
                self.replies.pop(sid, None)  # to the end: the latest
                self.replies[sid] = self._expected_of(stats)
        while len(self.replies) > REPLIES:
            self.replies.pop(next(iter(self.replies)))
        after = [p + n for p, n in zip(positions, kept)]
        self.carry = {sid: c for sid, c in self.carry.items() if c[1] is not io}
        self.carry.update(
            {sid: ((ids[i], after[i], last[i]), io, i) for i, sid in enumerate(stream_ids)}
        )
        self._hand_off(ids, after, last, io, stream_ids, draws)
        return launched

    def _load(self, io, ids, tokens, positions, stream_ids, hints, carry) -> set[int]:
        """io's pending tokens, positions and drafts: where every session goes on from a
        drafted call's carry (`carry`: carry_of's), copied on the device; else from the
        host (`_first_drafts`). Returns the sessions (by index) whose first drafts are
        padding only."""
        drv, b = self.driver, len(ids)
        if carry is not None:
            if any(src is not io or row != i for i, (_, src, row) in enumerate(carry)):
                froms = {id(src): [x.clone() for x in src.inputs()] for _, src, _ in carry}
                for i, (_, src, row) in enumerate(carry):
                    for dst, x in zip(io.inputs(), froms[id(src)]):
                        dst[i].copy_(x[row])
            for x in io.inputs():  # the pad rows from position 0 again
                x[b:].zero_()
            self.num_carried += 1
            return set()
        hints = hints or [[] for _ in ids]
        sessions = {s: drv.sessions[i] for s, i in zip(stream_ids, ids)}
        drv.drafter.absorb_waiting(list(stream_ids), sessions, list(tokens), cells=self.absorber)
        first = self._first_drafts(ids, stream_ids, hints) + [[0] * self.depth] * (io.size - b)
        pad = [0] * (io.size - b)
        pinned = torch.tensor([[*tokens, *pad], [*positions, *pad]], pin_memory=drv.is_cuda)
        io.tok.copy_(pinned[0], non_blocking=True)
        io.pos.copy_(pinned[1], non_blocking=True)
        io.drafts.copy_(torch.tensor(first, pin_memory=drv.is_cuda), non_blocking=True)
        return {i for i, h in enumerate(hints) if not h}

    def carry_of(self, stream_ids, ids, positions, tokens, depth: int | None = None):
        """Each stream's carry (where a drafted call of `depth`, default this one's, left
        it: session, position, pending token), or None unless every stream has one that
        matches where it is now."""
        depth = self.depth if depth is None else depth
        carry = [self.carry.get(sid) for sid in stream_ids]
        where = list(zip(ids, positions, tokens))
        if all(c is not None and c[0] == w and c[1].depth == depth for c, w in zip(carry, where)):
            return carry
        return None

    def _first_drafts(self, ids, stream_ids, hints) -> list[list[int]]:
        """The first step's drafts, its head having absorbed every waiting cell (`_load`):
        each stream's hints (none: drafts that do not land), padded to the depth. No host
        chain: its draws cost a sync a stream and depth (H200, embedded model: a drafted
        call took 1.04 ms a step with its loads, 0.57 without), and the first step's own
        chain drafts on the device."""
        return [(list(h) + [0] * self.depth)[: self.depth] for h in hints]

    def _hand_off(self, ids, after, last, io, stream_ids, draws) -> None:
        """Sessions and MTP queues as shared rounds would take them: each session at its kept
        length, its head's cache valid below the last kept row, whose cell (with the pending
        token) waits in the drafter's queue (absorbing it again writes the same cell)."""
        drafter = self.driver.drafter
        for i, sid in enumerate(ids):
            s = self.driver.sessions[sid]
            s.length = after[i]
            s.mtp_length = after[i] - 1
            drafter.waiting[stream_ids[i]] = Waiting(
                [io.last[i : i + 1].clone()], [last[i]], False, draws[i]
            )


def _lefts(left, b: int) -> list:
    """choose's `left` as a count a reply (inf: as many as the steps give)."""
    return left if isinstance(left, list) else [math.inf if left is None else left] * b
