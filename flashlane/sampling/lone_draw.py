"""The keyed draw that ends a lone step (runner/lone.py) for sampled streams, on the device.

`KeyedDraw` belongs to one set of the lone driver's buffers (B streams, one row each). `load`
writes the streams' parameter table once, when the driver takes them; each step then draws
the token for position pos + 1 (the row holds the token at pos, DESIGN.md section 3: the
position shared rounds key the same token with) and, as kernels.greedy_step does for greedy
steps, writes out [B, 2] (token, flag), tok the token and pos + 1.

On CUDA a step is triton_draw's launches (`launch`, the shared rounds' kernels) over a
workspace this object owns, after a copy of pos + 1 into the table's positions and before
triton_lone's landing: no host value is read and nothing is allocated, so the driver's CUDA
graph holds the step. The kernels draw greedy, plain, min_p, top_k (up to MAX_TOP_K) and top_p
rows (sampling/kinds.py). The tokens are the shared rounds': the same launches on the same
logits bits (draw_rows_gpu sends these rows to them as well), and a row's result does not
depend on the other rows, the chunk count or K. Elsewhere (the CPU, no Triton, fp64
logits) a step calls the shared rounds' draw for the logits' device, reading pos on the host;
the CPU has no graphs.

The kernels do not take a row whose draw adjusts its logits (kinds.OTHER: logit_bias, a
penalty; also top_k past MAX_TOP_K): on CUDA sampling/adjusted_draw.py draws those after them
in the same step, with each row's reply counts on the device. A top_p cut the kernels cannot
prove (sums within rounding of top_p * S) lands UNSETTLED, as it comes back None to
draw_rows_gpu; so does every step of an OTHER row adjusted_draw does not take (with top_p, or
values that could overflow). A call with rows that may (`may_need_host`) keeps the step's
logits (fp32, as shared rounds draw from: model.logits) in a buffer of its own, where the next
step has not yet overwritten them: the driver runs such calls one step in flight and `settle`
draws the unsettled rows together as draw_rows_gpu does (its torch path, then the CPU's), each
with its stream's prompt and its reply as the step found it (the lane host appends each landed
token before the next step is settled), and writes the tokens into tok before the next step is
launched. A row whose request asks for logprobs gets them reported in the step
(sampling/logprobs.StepLogprobs: row_logprobs' ops on the device), read by `settle` from the
driver's ring slot.

A row without a token (no finite candidate, a NaN or +inf logit) gets flag 0 and in the
token's place a negative code; `spec.failure` turns it into the SampleError shared rounds give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from flashlane.request import SamplingParams
from flashlane.sampling.adjusted_draw import AdjustedRows
from flashlane.sampling.choose import draw_rows
from flashlane.sampling.gpu import draw_rows_gpu, fused_kernels
from flashlane.sampling.kinds import (
    MAX_TOP_K,
    OTHER,
    PLAIN,
    TOP_K,
    is_always_settled,
    row_kind,
)
from flashlane.sampling.logprobs import StepLogprobs, row_logprobs
from flashlane.sampling.spec import (
    INF_AT,
    NAN_AT,
    NO_CANDIDATE,
    UNSETTLED,
    DrawSpec,
    is_plain_greedy,
)
from flashlane.sampling.vocab_rows import VocabRows

GREEDY = SamplingParams(temperature=0.0)


def failure_code(row: torch.Tensor) -> int:
    """The code of a row without a token: its first NaN, else its first +inf, else none."""
    for code, bad in ((NAN_AT, torch.isnan(row)), (INF_AT, torch.isposinf(row))):
        if bad.any():
            return code - 2 * int(bad.nonzero()[0, 0])
    return NO_CANDIDATE


def keyed_specs(draws: Sequence, positions: Sequence[int]) -> list[DrawSpec] | None:
    """The streams' specs for a keyed step from their lanes.records.Draws and pending
    positions (each step sets its own), or None when every stream draws plain-greedy
    (kernels.greedy_step serves them in one launch). A spec holds the stream's own prompt and
    reply lists (not copies), which grow as its tokens land: penalties read them as they are
    at each step. No `draws` (tests): greedy."""
    specs = [
        DrawSpec(d.params, d.seed, p + 1, d.prompt_ids, d.reply_ids)
        if d is not None
        else DrawSpec(GREEDY, 0, p + 1)
        for d, p in zip(draws, positions)
    ]
    plain = all(is_plain_greedy(s) and s.params.logprobs is None for s in specs)
    return None if plain else specs


class KeyedDraw:
    """The keyed draw of a lone step of B streams, with its workspace (module docstring)."""

    def __init__(
        self,
        b: int,
        vocab: int,
        device: torch.device,
        fused: bool | None = None,
        block: int | None = None,
        slots: int = 4,  # runner/lone_buffers.RING
        rows: VocabRows | None = None,
    ):
        """`fused`: steps run triton_draw's kernels (default: on CUDA, where Triton imports;
        tests ask for them on the CPU under TRITON_INTERPRET=1). `block`: their ids per
        program (tests shrink it so rows span many chunks). `slots`: the driver's ring of
        landed steps (`post`). `rows`: the [B, V] buffers the driver's draws of every size
        share (sampling/vocab_rows.py; a pool of its own if None)."""
        self.pool = rows if rows is not None else VocabRows(b, vocab, device)
        self.b, self.vocab, self.device, self.block = b, vocab, device, block
        self.reported = StepLogprobs(b, device, slots)
        self.specs: list[DrawSpec] = []
        self.launches = None  # triton_draw.Launches of the loaded rows (fused steps)
        # some loaded row may land UNSETTLED (a top_p cut): the step keeps its logits
        self.may_need_host = False
        # the last step's logits [B, V] while may_need_host: fused, `held` (fp32, the pool's,
        # taken at the first such load; graphs hold its address); on the host path the step's
        # own tensor
        self.logits: torch.Tensor | None = None
        self.logprobs: dict[int, dict[int, float]] = {}  # the last settled step's, by row
        self.held: torch.Tensor | None = None
        if fused is None:
            fused = device.type == "cuda"
        self.fused = fused and fused_kernels() is not None
        if self.fused:
            from flashlane.kernels.sampling.triton_keyed import NPARAM

            # sized for the largest call (top_k rows up to MAX_TOP_K) and never reallocated:
            # a graph holds its address. KEYS is the last region, so a smaller K fits.
            widest = self._launches([PLAIN, TOP_K], [MAX_TOP_K])
            self.ws = torch.zeros(widest.words, dtype=torch.long, device=device)
            self.table = self.ws[: b * NPARAM].view(b, NPARAM)
            self.positions = self.table[:, 6]  # NPARAM's columns end with seed, position
            self.adjusted = AdjustedRows(b, vocab, device, self.pool)

    @property
    def key(self) -> tuple:
        """What a graph of the step is compiled for besides the buffers (Launches' flags,
        whether the step keeps its logits, the adjusted rows' shape, the rows reporting
        logprobs)."""
        shape = self.launches
        if shape is None:
            return ()
        flags = (shape.k, shape.has_top_k, shape.plain_rows, shape.top_p_rows)
        return (*flags, self.may_need_host, *self.adjusted.key, self.reported.rows)

    def load(self, specs: Sequence[DrawSpec]) -> None:
        """The streams' draws, one per row (positions are set by each step): the table goes
        to the device now, outside any step."""
        if len(specs) != self.b:
            raise ValueError(f"a lone keyed draw takes {self.b} rows, not {len(specs)}")
        self.specs, self.logprobs = list(specs), {}
        kinds = [row_kind(s.params, self.vocab) for s in specs]
        on_device = set()
        if self.fused:
            other = [i for i, k in enumerate(kinds) if k == OTHER]
            on_device = set(self.adjusted.load([specs[i] for i in other], other))
        self.may_need_host = not all(
            is_always_settled(s.params, self.vocab) or i in on_device for i, s in enumerate(specs)
        )
        asks = [(i, s.params.logprobs) for i, s in enumerate(specs)]
        self.reported.rows = tuple((i, top) for i, top in asks if top is not None)
        if self.fused:
            tdraw = fused_kernels()
            top_ks = [s.params.top_k for s, k in zip(specs, kinds) if k == TOP_K]
            self.launches = self._launches(kinds, top_ks)
            self.table.copy_(tdraw.param_table(specs, kinds, self.vocab))
            if self.may_need_host and self.held is None:
                self.held = self.pool.take("held", self.b)

    def __call__(
        self, logits: torch.Tensor, out: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor
    ) -> None:
        """logits [B, V] -> out [B, 2] (token or failure code, flag), tok, pos + 1."""
        tdraw = fused_kernels()
        if self.fused and logits.dtype in tdraw.DTYPES and logits.stride(1) == 1:
            from flashlane.kernels.sampling.triton_lone import land

            if self.may_need_host:
                # fp32 widens exactly: the kernels read the bits shared rounds draw from
                self.held.copy_(logits)
                logits = self.logits = self.held
            shape = self.launches
            torch.add(pos, 1, out=self.positions)
            tdraw.launch(logits, self.ws, shape)
            land(self.ws, self.b, shape.chunks, shape.kp, logits, out, tok, pos)
            if self.adjusted.n:
                self.adjusted(logits, out, tok, self.positions)
        else:
            if self.may_need_host:
                self.logits = logits
            self._on_host(logits, out, tok, pos)
        if self.reported.rows:
            self.reported.report(logits, tok)

    def moved(self) -> tuple[torch.Tensor, ...]:
        """The draw's tensors a step moves on (adjusted rows' counts): a warm-up step's
        inputs, put back after it (runner/lone_buffers.warm_up)."""
        return self.adjusted.moved() if self.fused else ()

    def post(self, slot: int) -> None:
        """After a step's launch: its logprobs into the driver's ring slot, unawaited."""
        self.reported.post(slot)

    def settle(
        self, rows: list[list[int]], tok: torch.Tensor, pos: torch.Tensor, slot=None
    ) -> list[list[int]]:
        """The last step's landed rows [token or code, flag], with the rows the device left
        UNSETTLED drawn together from the logits the step kept, as shared rounds draw the rows
        the kernels return None for (draw_rows_gpu's torch path on CUDA, the CPU's draw
        elsewhere), at the positions the step drew (pos [B] has moved on to them). Their
        tokens go into tok [B], the next step's input: the driver settles before it launches
        that step. The rows whose requests ask for logprobs get them (`logprobs`, by row):
        the step reported them on the device (ring `slot`, where `post` put them; None: the
        last step's), the host from the kept logits for a row it drew here."""
        if not (self.may_need_host or self.reported.rows):
            return rows  # nothing lands unsettled, nothing to report
        idx = [i for i, (code, flag) in enumerate(rows) if not flag and code == UNSETTLED]
        if idx:
            self._draw_unsettled(rows, idx, tok, pos)
        self.logprobs = self.reported.read(slot, rows, skip=idx) if self.reported.rows else {}
        self.logprobs.update(self._logprobs(rows, idx))
        return rows

    def _draw_unsettled(self, rows, idx: list[int], tok: torch.Tensor, pos: torch.Tensor):
        at = pos[idx].tolist() if len(idx) < self.b else pos.tolist()
        specs = [dataclasses.replace(self.specs[i], position=p) for i, p in zip(idx, at)]
        logits = self.logits[idx].float()
        if logits.is_cuda:
            got = draw_rows_gpu(logits, specs, fused=False)
        else:
            got = draw_rows(logits, specs)
        for j, (i, g) in enumerate(zip(idx, got)):
            # a failed row keeps tok 0 (the reply ends)
            rows[i] = [g, 1] if isinstance(g, int) else [failure_code(logits[j]), 0]
        tok[idx] = torch.tensor([rows[i][0] if rows[i][1] else 0 for i in idx]).to(tok.device)

    def _logprobs(self, rows, idx: list[int]) -> dict[int, dict[int, float]]:
        """Rows idx's logprobs where their requests ask (params.logprobs: the top count), from
        the logits the step kept, as shared rounds report them (the step's report read the
        token it left there, before the host drew one)."""
        want = [(i, self.specs[i].params.logprobs) for i in idx]
        want = [(i, top) for i, top in want if top is not None and rows[i][1]]
        return {
            i: row_logprobs(self.logits[i : i + 1].float(), [rows[i][0]], top)[0] for i, top in want
        }

    def _launches(self, kinds: list[int], top_ks: list[int]):
        tdraw = fused_kernels()
        return tdraw.Launches.of(self.b, self.vocab, kinds, top_ks, self.block or tdraw.BLOCK)

    def _on_host(self, logits, out, tok, pos) -> None:
        """The shared rounds' draw for the logits' device (backend._draw_all), pos read here."""
        specs = [dataclasses.replace(s, position=p + 1) for s, p in zip(self.specs, pos.tolist())]
        logits = logits.float()  # what shared rounds draw from (model.logits)
        got = (draw_rows_gpu if logits.is_cuda else draw_rows)(logits, specs)
        codes = [g if isinstance(g, int) else failure_code(logits[i]) for i, g in enumerate(got)]
        codes_t = torch.tensor(codes, dtype=torch.long, device=out.device)
        out[:, 0] = codes_t
        out[:, 1] = codes_t >= 0
        tok.copy_(codes_t.clamp(min=0))
        pos.add_(1)
