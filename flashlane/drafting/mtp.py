"""MTP drafting: absorb the kept rows into the head's cache, then chain drafts.

Cell i pairs the target's residual R_i with x_{i+1} at position i. A stream's cells wait here
until their next token is known (a prompt piece's last row waits for the next piece); the
draft call absorbs every waiting cell (rewinding the head's cache past last round's chained
cells first: they were provisional), then chains: cell i+1 pairs the head's own output
residual with the draft. Each draft is keyed at its own position with the stream's params and
seed; the first is always kept, a later one below `confidence` ends the chain.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from flashlane.lanes.records import Drafts, Draws
from flashlane.models.flashnext import FlashNext
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.sampling.choose import DrawSpec, SampleError, draw_rows


@dataclass(slots=True)
class Waiting:
    """A stream's kept rows whose cells the head has not absorbed, in position order: cell i
    pairs row i with next_ids[i]; with `is_dangling` the last row waits for its next token."""

    blocks: list[torch.Tensor] = field(default_factory=list)  # [n, hc*H] each, as kept
    next_ids: list[int] = field(default_factory=list)
    is_dangling: bool = False
    draws: Draws | None = None

    @property
    def dangling(self) -> torch.Tensor | None:
        """[hc*H] the row whose next token is not known yet."""
        return self.blocks[-1][-1] if self.is_dangling else None

    def take(self) -> tuple[torch.Tensor, list[int]]:
        """The rows of every complete cell and their next ids; the dangling row stays."""
        rows = self.blocks[0] if len(self.blocks) == 1 else torch.cat(self.blocks)
        ids, n = self.next_ids, len(self.next_ids)
        self.blocks = [rows[n:]] if self.is_dangling else []
        self.next_ids = []
        return rows[:n], ids


# the most cells one head forward absorbs: a long prompt's queue (thousands of rows) in one
# forward stalled every stream for 20 s on the CPU (issue 29); a stream's queue past this many
# is absorbed as its windows are kept (runner/backend.py), not all at once at a prompt mark;
# a prompt cut in pieces has each piece's cells absorbed as it is kept
CATCH_UP_ROWS = 512


class MtpDrafter:
    def __init__(self, model: FlashNext, confidence: float):
        self.model, self.confidence = model, confidence
        # read on every kept window: a module attribute lookup costs more than this bool
        self.enabled = model.mtp is not None
        self.waiting: dict[int, Waiting] = {}
        # streams whose head missed cells (`lag`): they queue none and draft no more
        self.lagging: set[int] = set()
        # Drafts only steer speed (verification is exact), so their lm_head may run in fp32
        # where the target computes in fp64: on the CPU that halves the head's largest GEMM.
        w = model.lm_head.weight
        self._head = w.float() if w.dtype == torch.float64 else w

    def _cells(self, residual, next_ids, rows, draw_at=None) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP cells -> (fp32 logits of the rows `draw_at` (default all), output residual)."""
        m = self.model
        hidden, out = m.mtp(residual, m.embed_tokens(next_ids), rows, m.rotary, m.kernels, m.graphs)
        if draw_at is not None:
            hidden = hidden[draw_at]
        logits = torch.nn.functional.linear(hidden.to(self._head.dtype), self._head)
        # a tensor-parallel rank's head holds a slice of the vocabulary (parallel/plan.py)
        combine = m.lm_head.combine
        return (logits if combine is None else combine(logits)).float(), out

    def forget(self, stream_id: int) -> None:
        self.waiting.pop(stream_id, None)
        self.lagging.discard(stream_id)

    def start(self, stream_id: int) -> None:
        """A stream's first window: no cells wait (a lag set for it before,
        lanes/lone_turn.lag_heads, stays)."""
        self.waiting.pop(stream_id, None)

    def lag(self, stream_ids: Sequence[int]) -> None:
        """These streams' heads take no more cells (their rows went unqueued: the lone
        driver's batches that no drafted step takes), so they draft no more in their reply:
        their waiting cells go, later windows queue none, `draft` gives them none."""
        for sid in stream_ids:
            self.waiting.pop(sid, None)
            self.lagging.add(sid)

    def absorb_later(
        self,
        stream_id: int,
        residual: torch.Tensor,
        tokens: Sequence[int],
        next_token: int | None,
        draws: Draws,
    ) -> None:
        """Queue cells for kept rows: residual [n, hc*H] of tokens; next_token follows them.
        Cheap (a view and a few ids): every kept window of a drafting request queues here,
        drafting this round or not."""
        if stream_id in self.lagging:
            return
        w = self.waiting.get(stream_id)
        if w is None:
            w = self.waiting[stream_id] = Waiting()
        w.draws = draws
        w.blocks.append(residual)
        # a dangling row's next token is this window's first
        w.next_ids.extend(tokens if w.is_dangling else tokens[1:])
        if next_token is not None:
            w.next_ids.append(next_token)
        w.is_dangling = next_token is None

    @torch.no_grad()
    def absorb(self, stream_id: int, session: SessionState) -> torch.Tensor | None:
        """Absorb the stream's waiting cells into the head's cache now (no drafts); returns the
        residual of its last row, whose cell waits for the next token (None: nothing waits)."""
        w = self.waiting.get(stream_id)
        if not self.enabled or w is None or not w.is_dangling:
            return None
        self.catch_up(stream_id, session)
        return w.dangling

    @torch.no_grad()
    def catch_up(self, stream_id: int, session: SessionState) -> None:
        """Absorb the stream's complete waiting cells into the head's cache now (a dangling
        row stays), CATCH_UP_ROWS at a time: its queue of residual rows empties."""
        w = self.waiting.get(stream_id)
        if not self.enabled or w is None or not w.next_ids:
            return
        m = self.model
        res, ids = w.take()
        for a in range(0, len(ids), CATCH_UP_ROWS):
            piece = ids[a : a + CATCH_UP_ROWS]
            cells = [(session, torch.tensor(piece), session.mtp_length, False)]
            rows = Rows.of(cells, res.device)
            m.mtp(
                res[a : a + len(piece)],
                m.embed_tokens(rows.token_ids),
                rows,
                m.rotary,
                m.kernels,
                m.graphs,
            )
            session.mtp_length += len(piece)

    def queued(self, stream_id: int) -> int:
        """The stream's complete cells waiting for its head."""
        w = self.waiting.get(stream_id)
        return len(w.next_ids) if w is not None else 0

    def resume(self, stream_id: int, dangling: torch.Tensor | None) -> None:
        """A stream resumed from a kept state: its cell at the kept length waits for a token."""
        self.forget(stream_id)
        if dangling is not None:
            self.waiting[stream_id] = Waiting([dangling.unsqueeze(0)], is_dangling=True)

    @torch.no_grad()
    def draft(
        self, depths: Mapping[int, int], sessions: Mapping[int, SessionState]
    ) -> list[Drafts]:
        out = {sid: Drafts(sid, [], []) for sid in depths}
        absorbed = self._absorb(list(depths), sessions, logits=True)
        if absorbed is None:
            return list(out.values())
        ready, r, lg = absorbed
        drafts = {s: [] for s in ready}
        probs = {s: [] for s in ready}
        live = list(ready)
        for d in range(1, max(depths[s] for s in ready) + 1):
            live, r, lg = self._extend(live, r, lg, d, depths, sessions, drafts, probs)
            if not live:
                break
        for s in ready:
            out[s] = Drafts(s, drafts[s], probs[s])
        return list(out.values())

    @torch.no_grad()
    def absorb_waiting(
        self,
        stream_ids: list[int],
        sessions: Mapping[int, SessionState],
        pending: list[int],
        cells: Callable | None = None,
    ) -> None:
        """Every waiting cell of these streams into their heads' caches, no drafts (the lone
        driver's drafted steps chain on the device: a host chain's draws cost a sync a
        stream and depth). A dangling row's next token is its stream's `pending` one (the
        token the next step feeds), so no position below it is left unwritten for the
        device's chain to read. cells([(session, rows [n, hc*H], next ids), ...]): what absorbs
        the streams' cells, each from its session's mtp_length on (the lone driver's graphs,
        runner/absorb.py); None: one head forward."""
        for sid, token in zip(stream_ids, pending):
            w = self.waiting.get(sid)
            if w is not None and w.is_dangling:
                w.next_ids.append(token)
                w.is_dangling = False
        if cells is None:
            self._absorb(stream_ids, sessions, logits=False)
            return
        ready = [s for s in stream_ids if self.enabled and s in self.waiting]
        queues = [(sessions[s], *self.waiting[s].take()) for s in ready if self.queued(s)]
        if queues:
            cells(queues)
        for session, _, ids in queues:
            session.mtp_length += len(ids)

    def _absorb(self, stream_ids, sessions, logits: bool):
        """Absorb the streams' waiting cells in one forward -> None where none waits, else
        (the streams absorbed, each one's last output residual and, with `logits`, its
        logits there; else None)."""
        ready = [
            sid
            for sid in stream_ids
            if self.enabled and self.waiting.get(sid) and self.waiting[sid].next_ids
        ]
        if not ready:
            return None
        taken = [self.waiting[s].take() for s in ready]
        cells = [
            (sessions[s], torch.tensor(ids), sessions[s].mtp_length, False)
            for s, (_, ids) in zip(ready, taken)
        ]
        res = torch.cat([r for r, _ in taken]) if len(taken) > 1 else taken[0][0]
        rows = Rows.of(cells, res.device)
        # every cell goes into the head's cache, but logits only at each stream's last
        last = [p.offset + p.length - 1 for p in rows.pieces]
        if logits:
            lg, outs = self._cells(res, rows.token_ids, rows, draw_at=last)
        else:
            m = self.model
            _, outs = m.mtp(
                res, m.embed_tokens(rows.token_ids), rows, m.rotary, m.kernels, m.graphs
            )
            lg = None
        for s, p in zip(ready, rows.pieces):
            sessions[s].mtp_length += p.length
        return ready, outs[last], lg

    def _extend(self, live, r, lg, d, depths, sessions, drafts, probs):
        """Draw draft d for each live stream from lg, then run the next chained cell."""
        specs = []
        for s in live:
            w = self.waiting[s]
            pos = sessions[s].length + d  # the pending token sits at sessions[s].length
            reply = [*w.draws.reply_ids, *drafts[s]]
            specs.append(DrawSpec(w.draws.params, w.draws.seed, pos, w.draws.prompt_ids, reply))
        got = draw_rows(lg, specs)
        p = torch.softmax(lg.double(), dim=-1)
        keep_idx = []
        for i, (s, tok) in enumerate(zip(live, got)):
            if isinstance(tok, SampleError):
                continue
            prob = float(p[i, tok])
            if d > 1 and prob < self.confidence:
                continue
            drafts[s].append(int(tok))
            probs[s].append(prob)
            if d < depths[s] and sessions[s].mtp_length + d <= sessions[s].capacity:
                keep_idx.append(i)
        live = [live[i] for i in keep_idx]
        if not live:
            return [], None, None
        cells = [
            (sessions[s], torch.tensor([drafts[s][-1]]), sessions[s].mtp_length + d - 1, False)
            for s in live
        ]
        rows = Rows.of(cells, r.device)
        lg, r = self._cells(r[keep_idx], rows.token_ids, rows)
        return live, r, lg
