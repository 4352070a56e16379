"""The lane core's Backend on tensors: one target forward per round over every window.

verify packs all windows (decode windows and prompt pieces of many streams) into one flat
batch, runs the model once, draws every drawing row with the keyed sampler and keeps what
each piece wrote as pending; keep commits the kept rows and rolls back the rest (attention:
cache length; GDN: the state after the last kept row, an index into the per-row states;
conv windows, PLE tail and ids: a slice of their input history); draft lets the MTP head
absorb the kept rows and chains drafts for all drafting streams together.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from flashlane.drafting.mtp import CATCH_UP_ROWS, MtpDrafter
from flashlane.kernels import row_kind
from flashlane.lanes.records import CHUNK, CostTable, Drafts, InvalidBatch, Verdict, Window
from flashlane.models.flashnext import FlashNext, commit_all
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.rows import Piece, Rows, copy_all
from flashlane.models.state import SessionState, reset_all, state_copies
from flashlane.runner import kept as kept_states
from flashlane.runner.fresh import fresh_prompts
from flashlane.sampling.choose import (
    DrawSpec,
    SampleError,
    draw_rows,
    greedy_on_device,
    is_plain_greedy,
)
from flashlane.sampling.gpu import draw_rows_gpu
from flashlane.sampling.grammar import GrammarError, Grammars, StreamGrammar
from flashlane.sampling.logprobs import row_logprobs


@dataclass(slots=True)
class Fed:
    """A window fed by the last verify, waiting for keep."""

    window: Window
    piece: Piece
    residual: torch.Tensor  # [rows, hc*H] pre-mixer residual of its rows
    sampled: list[int] = field(default_factory=list)


class ModelBackend:
    def __init__(
        self,
        model: FlashNext,
        sessions: Sequence[SessionState],
        max_rows: int,
        costs: CostTable | None = None,
        mtp_confidence: float = 0.7,
        max_prompt_rows: int = 4096,
        grammars: Grammars | None = None,
    ):
        self.model, self.sessions = model, list(sessions)
        # the FP8 GEMMs give prompt rows tiles of their own (kernels/row_kind.py)
        self.row_kinds = bool(fp8_weights(model))
        self.max_rows, self.max_prompt_rows = max_rows, max_prompt_rows
        self.bound: dict[int, int] = {}  # stream_id -> session_id
        self.fed: dict[int, Fed] = {}
        self.kept: dict[int, kept_states.KeptState] = {}  # prompt-cache entry id -> state
        self.drafter = MtpDrafter(model, mtp_confidence)
        self._costs = costs or CostTable(verify_ms={1: 1.0}, draft_step_ms=0.0, overhead_ms=0.0)
        self.device = model.embed_tokens.weight.device
        # constrained decoding: None without a tokenizer (a constrained stream then fails)
        self.grammars = grammars
        self.grammar_states: dict[int, StreamGrammar] = {}  # stream_id -> its grammar state
        # a new stream's whole short prompt as one graph where the blocks' parts replay (CUDA,
        # one process), with bf16 products: runner/fresh.py
        self.fresh = None if self.row_kinds else fresh_prompts(model, self.sessions)

    def costs(self) -> CostTable:
        return self._costs

    def set_costs(self, costs: CostTable) -> None:
        self._costs = costs

    # -- verify -------------------------------------------------------------------------
    def _check(self, windows: Sequence[Window]) -> None:
        if not windows:
            raise InvalidBatch("no windows")
        ids = [w.stream_id for w in windows]
        if len(set(ids)) != len(ids):
            raise InvalidBatch("a stream appears twice in one verify")
        taken = {self.bound[s]: s for s in self.bound}
        claimed = [w.session_id for w in windows if w.stream_id not in self.bound]
        if len(set(claimed)) != len(claimed):
            raise InvalidBatch("two new streams claim one session")
        decode_rows = sum(w.num_rows for w in windows if w.kind == "decode")
        prompt_rows = sum(w.num_rows for w in windows if w.kind == "prompt")
        kinds = [w.kind for w in windows]
        if self.row_kinds and kinds != sorted(kinds):  # "decode" < "prompt"
            # the FP8 GEMMs split a forward's rows by kind (kernels/row_kind.py) in two runs
            raise InvalidBatch("decode windows come before prompt pieces in a verify")
        if decode_rows > self.max_rows or prompt_rows > self.max_prompt_rows:
            raise InvalidBatch(
                f"{decode_rows} decode / {prompt_rows} prompt rows exceed "
                f"{self.max_rows} / {self.max_prompt_rows}"
            )
        for w in windows:
            if not w.tokens:
                raise InvalidBatch(f"stream {w.stream_id}: empty window")
            if not 0 <= w.session_id < len(self.sessions):
                raise InvalidBatch(f"stream {w.stream_id}: unknown session {w.session_id}")
            owner = taken.get(w.session_id)
            if owner is not None and owner != w.stream_id:
                raise InvalidBatch(f"session {w.session_id} belongs to stream {owner}")
            if self.bound.get(w.stream_id, w.session_id) != w.session_id:
                raise InvalidBatch(f"stream {w.stream_id} is bound to another session")
            s = self.sessions[w.session_id]
            length = s.length if w.stream_id in self.bound else 0
            if w.start != length:
                raise InvalidBatch(
                    f"stream {w.stream_id}: window starts at {w.start}, the session holds {length}"
                )
            if w.start + w.num_rows > s.capacity:
                raise InvalidBatch(f"stream {w.stream_id}: context full ({s.capacity} positions)")
            if w.kind == "prompt" and w.start % CHUNK and w.stream_id not in self.bound:
                raise InvalidBatch(f"stream {w.stream_id}: prompt piece off the {CHUNK} grid")

    def verify(self, windows: Sequence[Window]) -> list[Verdict]:
        self._check(windows)
        fresh = [w for w in windows if w.stream_id not in self.bound]
        reset_all([self.sessions[w.session_id] for w in fresh], self.model.cfg)
        for w in fresh:
            self.bound[w.stream_id] = w.session_id
            self.drafter.start(w.stream_id)
            self.grammar_states.pop(w.stream_id, None)
        self.fed.clear()
        specs = [
            (self.sessions[w.session_id], w.tokens, w.start, w.kind == "decode", _whole(w))
            for w in windows
        ]
        with torch.no_grad():
            rows = Rows.of(specs, self.device)
            forward, fresh = functools.partial(self._forward, windows, rows), self.fresh
            r, logits = fresh.round(windows, rows, forward) if fresh else forward()
        # no work at all unless a stream is constrained
        refused = self._constrain(windows, logits) if _any_constrained(windows) else {}
        specs = [_spec(w, i) for w in windows for i in range(w.num_draws)]
        picks = _draw_all(logits, specs, self.model.kernels)
        verdicts, row = [], 0
        for w, p in zip(windows, rows.pieces):
            n = w.num_draws
            fed = Fed(w, p, r[p.rows])
            got = [picks[i] for i in range(row, row + n)]
            if w.stream_id in refused:
                verdicts.append(Verdict(w.stream_id, [], error=refused[w.stream_id]))
            else:
                verdicts.append(self._verdict(w, logits[row : row + n] if n else None, fed, got))
            self.fed[w.stream_id] = fed
            row += n
        return verdicts

    def _forward(self, windows: Sequence[Window], rows: Rows) -> tuple:
        """The round's forward -> (residual rows, the drawing rows' fp32 logits or None)."""
        with self._kinds(windows, rows):
            r = self.model.residual(rows)
        draw_at = [i for w, p in zip(windows, rows.pieces) for i in _drawing_rows(w, p)]
        # the rows through pinned memory, not a list index: that copies from pageable
        # memory, and the host waits there for the whole forward before it launches the
        # head's kernels one by one
        at = rows.longs("draw_at", lambda: draw_at) if draw_at else None
        return r, (self.model.logits(r.index_select(0, at)) if draw_at else None)

    def _kinds(self, windows: Sequence[Window], rows: Rows):
        """The forward's rows by kind for the kernels (kernels/row_kind.py) where the model's
        FP8 GEMMs read them: the lane core puts the decode windows before the prompt
        pieces."""
        if not self.row_kinds:
            return contextlib.nullcontext()
        decode_rows = sum(w.num_rows for w in windows if w.kind == "decode")
        return row_kind.rows(decode_rows, rows.token_ids.shape[0])

    def _constrain(self, windows: Sequence[Window], logits: torch.Tensor | None) -> dict:
        """Sets the logits [draws, V] of ids each constrained window's grammar refuses to -inf,
        row by row (sampling/grammar.py); returns stream_id -> error for the streams whose
        grammar fails (no tokenizer, a grammar that does not compile, a refused reply)."""
        refused: dict[int, str] = {}
        row = 0
        for w in windows:
            n, structured = w.num_draws, w.draws.params.structured
            if n and structured is not None and logits is not None:
                tokens = w.tokens if w.kind == "decode" else w.tokens[-1:]
                try:
                    state = self.grammar_states.get(w.stream_id)
                    if state is None:
                        if self.grammars is None:
                            raise GrammarError("structured output needs the model's tokenizer")
                        state = self.grammar_states[w.stream_id] = self.grammars.matcher(structured)
                    allowed = state.row_masks(w.draws.reply_ids, tokens)
                except GrammarError as e:
                    refused[w.stream_id] = f"structured output: {e}"
                else:
                    refuse = torch.from_numpy(~allowed).to(logits.device)
                    logits[row : row + n].masked_fill_(refuse, float("-inf"))
            row += n
        return refused

    def _verdict(self, w: Window, logits: torch.Tensor | None, fed: Fed, got: list) -> Verdict:
        """The window's draws (a row's SampleError fails the stream), with logprobs if asked."""
        if logits is None:
            return Verdict(w.stream_id, [])
        errors = [g for g in got if isinstance(g, SampleError)]
        if errors:
            return Verdict(w.stream_id, [], error=f"sampling failed: {errors[0]}")
        fed.sampled = [int(g) for g in got]
        top = w.draws.params.logprobs
        lp = row_logprobs(logits, fed.sampled, top) if top is not None else None
        return Verdict(w.stream_id, list(fed.sampled), logprobs=lp)

    # -- keep, draft, move, release --------------------------------------------------------
    def keep(self, kept: Mapping[int, int]) -> None:
        feds = [(self.fed.pop(stream_id), n) for stream_id, n in kept.items()]
        for fed, n in feds:
            w, sid = fed.window, fed.window.stream_id
            if w.kind == "prompt" and n != w.num_rows:
                raise ValueError(f"stream {sid}: a prompt piece keeps all {w.num_rows} rows")
            if w.kind == "decode" and not 1 <= n <= w.num_rows:
                raise ValueError(f"stream {sid}: keeps {n} of {w.num_rows} rows")
        commit_all(self.model, [(fed.piece, n) for fed, n in feds])
        for fed, n in feds:
            w = fed.window
            if w.draws.params.draft and self.drafter.enabled:
                # the core has appended the new pending token (a forced one included)
                has_next = w.kind == "decode" or w.last_piece
                nxt = w.draws.reply_ids[-1] if has_next and w.draws.reply_ids else None
                rows = fed.residual if n == w.num_rows else fed.residual[:n]
                self.drafter.absorb_later(w.stream_id, rows, w.tokens[:n], nxt, w.draws)
                # a long prompt's cells follow its pieces (a piece's worth a round: no
                # CATCH_UP_ROWS forward stalling the decoders beside it every 512 rows)
                chunked = w.kind == "prompt" and not w.last_piece
                if chunked or self.drafter.queued(w.stream_id) >= CATCH_UP_ROWS:
                    self.drafter.catch_up(w.stream_id, self.sessions[w.session_id])
        self.fed.clear()

    def draft(self, depths: Mapping[int, int]) -> list[Drafts]:
        sessions = {sid: self.sessions[self.bound[sid]] for sid in depths}
        return self.drafter.draft(depths, sessions)

    def move(self, stream_id: int, session_id: int) -> None:
        src = self.sessions[self.bound[stream_id]]
        dst = self.sessions[session_id]
        if session_id in self.bound.values():
            raise InvalidBatch(f"session {session_id} is not free")
        copy_session(src, dst, self.model.cfg.indexer_block)
        self.bound[stream_id] = session_id

    # -- the prompt cache's states -----------------------------------------------------------
    def kept_bytes(self, stream_id: int) -> int:
        s = self.sessions[self.bound[stream_id]]
        waiting = self.drafter.waiting.get(stream_id)
        drafts = self.drafter.enabled and waiting is not None and waiting.dangling is not None
        hidden = self.model.cfg.hc_count * self.model.cfg.hidden_size
        return kept_states.kept_bytes(s, self.model.cfg.indexer_block, s.length, drafts, hidden)

    def keep_state(self, stream_id: int, entry_id: int) -> tuple[int, bool]:
        """Copy the stream's committed state under `entry_id`: (bytes taken, has drafts)."""
        s = self.sessions[self.bound[stream_id]]
        dangling = self.drafter.absorb(stream_id, s)
        state = kept_states.keep(s, self.model.cfg.indexer_block, dangling)
        self.kept[entry_id] = state
        return state.nbytes(), state.has_drafts

    def resume(self, stream_id: int, session_id: int, entry_id: int) -> int:
        """Bind a new stream to a free session holding the kept state; returns its length."""
        if stream_id in self.bound or session_id in self.bound.values():
            raise InvalidBatch(f"stream {stream_id} or session {session_id} is taken")
        state = self.kept[entry_id]
        s = self.sessions[session_id]
        s.reset(self.model.cfg)
        kept_states.put(state, s)
        self.bound[stream_id] = session_id
        self.drafter.resume(stream_id, state.dangling)
        return state.length

    def drop_state(self, entry_id: int) -> None:
        self.kept.pop(entry_id, None)

    def release(self, stream_id: int, keep_prompt_state: bool = False) -> None:
        self.bound.pop(stream_id, None)
        self.fed.pop(stream_id, None)
        self.grammar_states.pop(stream_id, None)
        self.drafter.forget(stream_id)


def _whole(w: Window) -> bool:
    """Whether the window is a prompt piece that is its whole prompt (Piece.whole)."""
    return w.kind == "prompt" and w.start == 0 and w.last_piece


def _draw_all(logits: torch.Tensor | None, specs: list[DrawSpec], kernels) -> list:
    """Every drawing row of the round: plain greedy rows where the logits are (one call; on
    Triton's kernels one launch), the rest in one batch, on the GPU with the fused keyed
    draw (sampling/gpu.py: the CPU path's tokens) or on the CPU; row -> id or SampleError."""
    if logits is None:
        return []
    greedy = [i for i, sp in enumerate(specs) if is_plain_greedy(sp)]
    step = kernels.greedy_step if kernels.name == "triton" else None
    picks: dict = greedy_on_device(logits, greedy, step)
    rest = [i for i in range(len(specs)) if i not in picks]
    if rest:
        draw = draw_rows_gpu if logits.is_cuda else draw_rows
        picks.update(zip(rest, draw(logits[rest], [specs[i] for i in rest])))
    return [picks[i] for i in range(len(specs))]


def _any_constrained(windows: Sequence[Window]) -> bool:
    return any(w.draws.params.structured is not None for w in windows)


def _drawing_rows(w: Window, p: Piece) -> range:
    if w.kind == "decode":
        return range(p.offset, p.offset + p.length)
    return range(p.offset + p.length - 1, p.offset + p.length) if w.last_piece else range(0)


def _spec(w: Window, r: int) -> DrawSpec:
    d = w.draws
    if w.kind == "prompt":
        return DrawSpec(d.params, d.seed, w.start + w.num_rows, d.prompt_ids, ())
    return DrawSpec(
        d.params, d.seed, w.start + r + 1, d.prompt_ids, [*d.reply_ids, *w.tokens[1 : r + 1]]
    )


def copy_session(src: SessionState, dst: SessionState, block: int) -> None:
    """Copy a stream's whole state into another session (of any capacity that holds it)."""
    if src.length > dst.capacity:
        raise ValueError(f"a session of {dst.capacity} positions cannot hold {src.length}")
    copy_all(*state_copies(src, dst, src.length, block))
    dst.length, dst.mtp_length, dst.last_residual = src.length, src.mtp_length, src.last_residual
