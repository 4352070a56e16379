"""The lone driver: the decoding streams' rounds as device-side steps.

The host hands it every decoding stream, greedy or sampled with any parameters (logprobs too),
without a grammar or a thinking budget (lanes/lone_turn.py), up to `lone_streams`, whatever else
runs (prompt pieces and other streams get a shared round beside them). The streams step in
lockstep, one row each (runner/lone_step.py: each op the shared rounds' on the same row, the
sessions' state read and written in place, the next token drawn on the device, greedily or by
the keyed draw of sampling/lone_draw.py), or a window each with drafts (runner/lone_draft.py).
No host value enters a step, so on CUDA one graph per batch size (keyed steps per shape of their
draw's kernels too) replays it for any sessions, named by tables written before the call
(runner/lone_buffers.py; greedy and drafted graphs captured at engine start, keyed ones at first
use). The host launches step n+1 before it reads step n's tokens from a small pinned ring (two
in flight), hands each landed token to the stop rules (a row without a token, to the stream's
error), and stops after a landed step when its `ends` rule says so of the replies ended
(lanes/lone_turn.py), a budget or room is spent, or the host has new work: the sessions then
hold the state shared rounds would have left them.

A top_p cut may be too close to call on the device (UNSETTLED, as in shared rounds), as may a
row with logit_bias or a penalty that sampling/adjusted_draw.py does not take: a call with such
a row runs one step in flight, the host drawing them from the kept logits with the shared
rounds' path before step n+1 launches (lone_draw.KeyedDraw.settle). Nothing provisional.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from flashlane.kernels import compiles
from flashlane.models.flashnext import FlashNext
from flashlane.models.state import SessionState
from flashlane.runner.absorb import ROWS as ABSORB_ROWS
from flashlane.runner.graphs import bucket_of, buckets
from flashlane.runner.lone_buffers import RING, SizeTables, StepBuffers, posts_to_pinned, warm_up
from flashlane.runner.lone_step import session_tables, step
from flashlane.sampling.lone_draw import KeyedDraw, keyed_specs
from flashlane.sampling.vocab_rows import VocabRows

__all__ = ["LoneDriver", "session_tables", "step"]

# a drafting stream's cells queued for its MTP head past which its head absorbs them (a stream
# that stays on the driver would queue a residual row per token for the whole reply)
MAX_WAITING = 256


class LoneDriver:
    """Runs `step` for one session, or several together, graphed on CUDA (one graph per
    batch size, plain and drafted), with two steps in flight (one for calls with a top_p
    stream)."""

    def __init__(
        self,
        model: FlashNext,
        sessions: list[SessionState],
        graphs: bool = True,
        drafter=None,
        max_steps: int = 64,
        sampled: bool = True,
        post: bool = True,
        max_rows: int | None = None,
    ):
        """`drafter` (drafting.mtp.MtpDrafter): a drafting stream's steps queue their cells
        there, as kept shared rounds do, so its MTP head catches up when it drafts again.
        sampled: the driver takes sampled streams too (EngineConfig.lone_sampled); post: a
        step stores its tokens into the pinned ring itself where it can (lone_post).
        max_rows: the plan's rows a round (memory.MemoryPlan.max_rows), which bound a drafted
        step's B*(K+1) rows as they bound a shared round's (None: unbounded)."""
        self.model, self.sessions, self.drafter = model, sessions, drafter
        self.max_steps, self.max_rows = max_steps, max_rows
        self.device = model.embed_tokens.weight.device
        self.is_cuda = self.device.type == "cuda"
        self.sampled = sampled  # sampled streams too (lanes/lone_turn.py), as shared rounds
        self.use_graphs = graphs and self.is_cuda and bool(sessions)  # sessions by size tables
        self.events = [torch.cuda.Event() for _ in range(RING)] if self.is_cuda else []
        # a step stores its verdict in the pinned ring itself where the GPU can write host
        # memory (kernels.record_row): no copy after each graph
        self.posts = not self.is_cuda or (post and posts_to_pinned(model, self.device))
        self.io: dict[tuple[int, int, bool], StepBuffers] = {}  # by (sessions, depth, keyed)
        # io.key() -> (its step, by size; the buffers it was captured on, which its replay reads)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        # one memory pool for every graph: they never run at once, and a step's results go to
        # the static buffers, so no replay overwrites memory in use
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_seconds, self.failed = 0.0, None  # failed: why steps run eagerly, if so
        self.log: Callable[[str], None] = lambda line: None  # the engine's, once it has started
        self.num_steps, self.widest = 0, 0  # widest: the most sessions a call has decoded
        # by (sessions, depth), what drafting weighs: ms a landed step, and ms a call spends
        # before its first step (tables, tokens, a drafted call's queue and hints; no capture)
        self.step_ms: dict[tuple[int, int], float] = {}
        self.load_ms: dict[tuple[int, int], float] = {}
        # drafted steps (lone_draft.py) of up to most_drafted sessions, Flash Next's (a sibling's
        # drafting streams step plainly, their cells queued, and draft in shared rounds)
        self.drafting, self.most_drafted = None, 0
        if drafter is not None and model.mtp is not None and isinstance(model, FlashNext):
            from flashlane.runner.lone_draft import MAX_STREAMS, Drafting

            self.drafting, self.most_drafted = Drafting(self), MAX_STREAMS
        # steps run in batches of `sizes` rows, one graph per size (plain, drafted, keyed
        # draw shape) for any sessions, named by size_tables (runner/lone_buffers.py), the
        # keyed draws' [B, V] buffers shared (sampling/vocab_rows.py)
        self.sizes = buckets(len(sessions)) if sessions else [1]
        self.vocab_rows = VocabRows(self.sizes[-1], model.cfg.vocab_size, self.device)
        d = self.drafting  # a pad row's reach: a call's steps, or an absorb's largest bucket
        reach = max(max_steps * (1 + d.depth), ABSORB_ROWS[-1]) if d else max_steps
        tables = SizeTables(model.cfg, sessions, reach, self.device) if self.use_graphs else None
        self.size_tables = tables

    def decode(
        self,
        session_id: int,
        token: int,
        position: int,
        budget: int,
        take: Callable[[int, bool], bool],
        stream_id: int = -1,
        draws=None,
    ) -> int:
        """decode_many for one session (its pending `token` at `position`)."""
        return self.decode_many(
            [session_id], [token], [position], budget, [take], [stream_id], [draws]
        )

    def decode_many(
        self,
        session_ids: list[int],
        tokens: list[int],
        positions: list[int],
        budget: int,
        takes: list[Callable[[int, bool], bool]],
        stream_ids: list[int],
        draws: list,
        ends: Callable[[list[bool]], bool] = any,
    ) -> int:
        """decode() for several sessions in lockstep; each landed step's tokens go to their
        takes, until `ends` says so of which said no (default: any). A batch no drafted step
        takes (past most_drafted) queues no cells: its drafting streams' heads lag."""
        started, budget = self.clock(), min(budget, self.max_steps)
        if budget <= 0:
            return 0
        b = len(session_ids)
        keyed = keyed_specs(draws, positions) is not None
        io = self.buffers(b, keyed=keyed)
        pad = io.size - b  # rows of the pad session (positions from 0: it holds max_steps)
        if keyed:  # the streams' parameter table, before any step reads it
            io.draw.load(keyed_specs([*draws, *[None] * pad], [*positions, *[0] * pad]))
        if io.table is not None:
            io.table.copy_(self.size_tables.of(tuple(session_ids), io.size), non_blocking=True)
        inputs = [[*tokens, *[0] * pad], [*positions, *[0] * pad]]
        pinned = torch.tensor(inputs, pin_memory=self.is_cuda)
        io.tok.copy_(pinned[0], non_blocking=True)
        io.pos.copy_(pinned[1], non_blocking=True)
        io.k.zero_()
        got, failed, done = [[t] for t in tokens], [False] * b, [False] * b

        def land(rows: list[list[int]]) -> bool:
            for i, (token_id, finite) in enumerate(rows[:b]):
                got[i].append(token_id)
                failed[i] = failed[i] or not finite
                lp = io.draw.logprobs.get(i) if keyed else None  # where asked: a third argument
                done[i] = not takes[i](token_id, bool(finite), *([lp] if lp else [])) or done[i]
            return not ends(done)

        launched = self.run_steps(tuple(session_ids), io, budget, land, started)
        for i, sid in enumerate(session_ids):
            self.sessions[sid].length = positions[i] + launched
        # a failed stream keeps no cells (as a failed shared round): its ids may be codes
        drafts = [d is not None and d.params.draft and not f for d, f in zip(draws, failed)]
        queued = [i for i, q in enumerate(drafts) if q]
        if queued and self.drafter is not None and self.drafter.enabled:
            if self.drafting is not None and b > self.most_drafted:  # heads that lag (once)
                self.drafter.lag(list({stream_ids[i] for i in queued} - self.drafter.lagging))
            else:  # one copy for every stream (the next call overwrites io.rows): a block each
                rows = io.rows[:launched, :b].transpose(0, 1).contiguous()
                for i in queued:
                    self._queue_cells(stream_ids[i], session_ids[i], rows[i], got[i], draws[i])
        return launched

    def _queue_cells(self, stream_id: int, session_id: int, rows, got: list[int], draws) -> None:
        """A drafting stream's steps' residual rows (its own copy) for its MTP head, absorbed
        when it drafts again, or now past MAX_WAITING (a lagging head takes none)."""
        n = rows.shape[0]
        self.drafter.absorb_later(stream_id, rows, got[:n], got[n], draws)
        if self.drafter.queued(stream_id) >= MAX_WAITING:
            self.drafter.catch_up(stream_id, self.sessions[session_id])

    def run_steps(self, ids, io, budget: int, land, started=None, fold_load=True, near=None):
        """Up to `budget` steps with io, two in flight (one where a top_p row may land
        unsettled, module docstring, or while near() says the step in flight may end the
        call: one launched past it is waste): each landed step's ring rows go to land(), and
        once it says stop the step in flight lands too. From four greedy steps on (keyed ones
        have more launches) folds the mean step time into step_ms and the time from `started`
        (`clock()` at the call's start) to the first step, less any capture, into load_ms
        (if `fold_load`), by (sessions, io.depth); a call in which a Triton kernel compiled
        folds nothing. Returns the steps launched."""
        started = started or self.clock()
        run = self.runner(ids, io)
        captured = self.capture_seconds - started[2]  # the load's absorbs' captures too
        draw = getattr(io, "draw", None)
        in_flight, launched, landed = 1 if draw is not None and draw.may_need_host else 2, 0, 0
        going, t0 = True, time.perf_counter()
        while landed < launched or (going and launched < budget):
            ahead = 1 if near is not None and near() else in_flight
            if going and launched < budget and launched - landed < ahead:
                run()
                self._post(io, launched)
                launched += 1
                if launched - landed < ahead and launched < budget:
                    continue  # put a second step in flight before reading the first
            rows = self._read(io, landed)
            if draw is not None:
                rows = draw.settle(rows, io.tok, io.pos, landed % RING)
            landed += 1
            going = land(rows) and going
        seconds, b = time.perf_counter() - t0, len(ids)
        self.num_steps, self.widest = self.num_steps + launched, max(self.widest, b)
        if launched >= 4 and draw is None and compiles.count() == started[1]:
            load, key = max(0.0, t0 - started[0] - captured), (b, io.depth)
            folds = [(self.step_ms, seconds / launched)] + [(self.load_ms, load)] * fold_load
            for table, ms in folds:
                old = table.get(key)
                table[key] = 1e3 * ms if old is None else 0.75 * old + 250 * ms
        return launched

    def capture_all(self) -> int:
        """Capture now (engine start) the greedy step of every size, the drafted step of
        every size that drafts (Drafting.eager_sizes) and its loads' absorbs: no greedy
        request pays a capture. Returns how many graphs there are. If a capture fails, lone
        steps run eagerly (same bits, more launches) and `failed` says why."""
        d = self.drafting
        ios = [self.buffers(size) for size in self.sizes]
        ios += [self.buffers(size, d.depth) for size in d.eager_sizes()] if d else []
        ios += d.absorber.all_buffers() if d and self.use_graphs else []  # runner/absorb.py
        for io in ios:
            if self.use_graphs:
                self.runner((), io)  # captured if new; a failure: eager steps from now on
        return len(self.graphs)

    def decode_drafted(self, *args, hints=None, left=None, ends=any):
        """decode_many in drafted steps (runner/lone_draft.py: Drafting.run's arguments) where
        Drafting.choose says they pay -> (drafts made, drafts landed), per session; None:
        plain steps (nothing ran). hints: each stream's guesses at its next tokens; left:
        the tokens each reply still wants (or one count for all); ends: decode_many's."""
        d = self.drafter  # a lagging head (decode_many queued none of its cells) drafts no more
        if self.drafting is None or d is None or not d.enabled or d.lagging & set(args[6]):
            return None
        return self.drafting.run(*args, hints=hints, left=left, ends=ends)

    def lag(self, stream_ids: list[int]) -> None:
        """These drafting streams go to a call wider than most_drafted: their heads lag."""
        if self.drafting is not None and self.drafter is not None:
            self.drafter.lag(stream_ids)

    def clock(self) -> tuple[float, int, float]:
        """A call's start for run_steps: the time, the Triton compiles and captures so far."""
        return time.perf_counter(), compiles.count(), self.capture_seconds

    def step_seconds(self, b: int) -> float | None:
        """A plain step's measured wall time for b sessions (or the nearest count), else None."""
        measured = [n for n, depth in self.step_ms if depth == 0]
        if not measured:
            return None
        near = min(measured, key=lambda n: (abs(n - b), n))
        return self.step_ms[(near, 0)] / 1e3

    def buffers(self, b: int, depth: int = 0, keyed: bool = False):
        """The static buffers of a step of b sessions (depth > 0: a drafted step's; keyed: a
        plain step's with the keyed draw). A graphed step's are those of the smallest size
        that holds b rows (`io.size`), with the session tables every size shares."""
        if self.use_graphs:
            b = bucket_of(b, self.sizes) or b
        if (b, depth, keyed) not in self.io:
            cfg = self.model.cfg
            width = cfg.hc_count * cfg.hidden_size
            if depth:
                from flashlane.runner.draft_step import DraftBuffers

                io = DraftBuffers(b, depth, cfg.hc_count, width, self.model.dtype, self.device)
                if self.size_tables is not None:
                    io.table = self.size_tables.device_table(b, depth)
                    io.table_keys = self.size_tables.draft_keys
            else:
                args = (b, cfg.vocab_size, self.device)
                draw = KeyedDraw(*args, rows=self.vocab_rows) if keyed else None
                io = StepBuffers(b, self.max_steps, width, self.model.dtype, self.device, draw)
                io.posts = self.posts
                if self.size_tables is not None:
                    io.table = self.size_tables.device_table(b)
                    io.table_keys = self.size_tables.keys
            self.io[(b, depth, keyed)] = io
        return self.io[(b, depth, keyed)]

    def _post(self, io: StepBuffers, i: int) -> None:
        """Step i's (id, finite) rows into its ring slot, unawaited (a step that `posts`: none)."""
        if not getattr(io, "posts", False):
            io.ring[i % RING].copy_(io.out, non_blocking=True)
        if getattr(io, "draw", None) is not None:
            io.draw.post(i % RING)  # its logprobs, where rows ask
        if self.is_cuda:
            self.events[i % RING].record()

    def _read(self, io: StepBuffers, i: int) -> list[list[int]]:
        """Step i's ring slot, once it has landed: a row per session."""
        if self.is_cuda:
            self.events[i % RING].synchronize()
        return io.ring[i % RING].tolist()

    def runner(self, ids: tuple[int, ...], io: StepBuffers) -> Callable[[], None]:
        """A step of these sessions with io: its graph's replay (captured if new), or eager."""
        if not self.use_graphs:
            return lambda: self._step(ids, io)
        key = io.key(ids)
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = self.graphs[key] = (self._capture(ids, io), io)
            except Exception as err:  # a step that cannot be captured runs eagerly from now on
                self._give_up(err)
                return self.runner(ids, io)
        if graph[1] is not io:  # other buffers than its replay reads: a stale io (9a2b8a0)
            raise RuntimeError(f"the lone graph {key} was captured on other buffers")
        return graph[0].replay

    def _give_up(self, err: Exception) -> None:
        self.use_graphs, self.failed = False, f"{type(err).__name__}: {err}"
        self.log(f"flashlane: lone step graphs failed, steps run eagerly: {self.failed}")
        self.graphs.clear()
        torch.cuda.synchronize()

    def _step(self, ids: tuple[int, ...], io: StepBuffers) -> None:
        if io.table is not None:  # any sessions, named by io.table from the anchor
            io.step(self.model, [self.size_tables.anchor] * io.size, io.tables())
        else:  # eager: the kernels make the sessions' tables
            io.step(self.model, [self.sessions[i] for i in ids], None)

    def _capture(self, ids: tuple[int, ...], io: StepBuffers) -> torch.cuda.CUDAGraph:
        """Capture a step of io's size (it records work, touching no session), after one step
        outside it on the pad session the first time (kernels compiled, the allocator warm)."""
        t = time.perf_counter()
        if not io.warm:
            self._warm(ids, io)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._step(ids, io)
        self.capture_seconds += time.perf_counter() - t
        return graph

    def _warm(self, ids: tuple[int, ...], io: StepBuffers) -> None:
        warm_up(io, io.pad_table(self.size_tables), lambda: self._step(ids, io))
