"""The lone driver: one stream decoding alone on device-side rounds (issue 9).

While a single undrafted, plain-greedy stream is live and nothing waits, the host hands its
rounds here. A step feeds the pending token at its position through the model, reading and
writing the session's state in place, takes the greedy draw on the device, writes it back as
the next step's token and advances the position there: no host value enters a step, so on
CUDA one graph per session replays it (`step` is captured once, at the session's first lone
step). The host launches step n+1 before it reads step n's token from a small pinned ring
(two rounds in flight), hands each landed token to the stop rules, and stops after a landed
round when the reply ends, its budget or room is spent, or the host has new work. The session
then holds the stream's state as shared rounds would have left it (every fed token
committed), and the lane core takes the stream on.

A step launched before the reply's end was read feeds a token the reply does not have; the
stream has ended and its session is released, so nothing reads that state. Attention reads the
whole caches with the length on the device, select_mask ranks without its host-side shortcut
(the same mask), and a block's pooled key is recomputed whenever a key is written into it
(the indexer reads it only once the block is complete). Each op is the one the shared rounds
run, on the same row, so the bits are the same (tests/runner/test_lone.py on the CPU,
tests/gpu/test_lone_gpu.py with graphs).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.state import AttnCache, GdnState, PleState, SessionState

RING = 4  # landed tokens waiting to be read (two in flight need two)


@torch.no_grad()
def step(model: FlashNext, s: SessionState, tok: torch.Tensor, pos: torch.Tensor,
         out: torch.Tensor, record: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Feed tok [1] at pos [1] into session s, commit it, and draw greedily: out [2] gets
    (the id, 1 if the row's maximum is finite), tok the id, and pos moves on by one. The row's
    residual goes to record = (rows [n, hc*H], k [1]) at rows[k], and k moves on (the MTP
    head's cells, absorbed when the stream drafts again)."""
    cfg, kernels = model.cfg, model.kernels
    r = model.embed_tokens(tok).repeat(1, cfg.hc_count)
    cos, sin = model.rotary.cos_sin(pos, r.dtype)
    for idx, layer in enumerate(model.layers):
        if layer.ple is not None:
            r = _ple(layer.ple, r, s.ple[idx], tok, kernels)
        a, w = layer.attn_hyper_connection.read(r)
        if layer.kind == "linear":
            y = _gdn(layer.linear_attn, a, s.gdn[idx], kernels)
        else:
            y = _attention(layer.self_attn, a, s.attn[idx], pos, cos, sin, model.rotary, kernels)
        r = layer.mlp_half(r, y, w, kernels)
    record[0].index_copy_(0, record[1], r)
    record[1].add_(1)
    top, ids = model.logits(r).max(dim=1)  # the first maximum: ties to the lower id
    out[0] = ids[0]
    out[1] = torch.isfinite(top)[0]
    tok.copy_(ids)
    pos.add_(1)


def _ple(ple, r: torch.Tensor, p: PleState, tok: torch.Tensor, kernels) -> torch.Tensor:
    history = torch.cat([p.ids, tok])[None]
    add, xfull = ple.stacked(r[None], history, p.conv[None], kernels)
    p.ids.copy_(history[0, 1:])
    p.conv.copy_(xfull[0, 1:])
    return (r[None] + add)[0]


def _gdn(gdn, a: torch.Tensor, g: GdnState, kernels) -> torch.Tensor:
    qkv, decay, beta, z = gdn.project(a)
    q, k, v, xfull = gdn.conv_qkv(qkv[None], g.conv[None], kernels)
    o, states = kernels.recurrent_gdn(q, k, v, decay[None], beta[None], g.recurrent[None])
    g.recurrent.copy_(states[0, -1])
    g.conv.copy_(xfull[0, 1:])
    return gdn.finish(o[0], z)


def _attention(attn, a, c: AttnCache, pos, cos, sin, rotary, kernels) -> torch.Tensor:
    cfg = attn.cfg
    q, gate, k, v, iq, raw = attn.project(a, cos, sin)
    c.k.index_copy_(0, pos, k)
    c.v.index_copy_(0, pos, v)
    c.index_keys.index_copy_(0, pos, raw)
    _pool_block(attn.indexer, c, pos, rotary, kernels)
    mask = kernels.select_mask(
        iq[None], c.block_keys[None], pos.view(1, 1), c.k.shape[0], cfg.indexer_block,
        cfg.indexer_top_blocks, dense_check=False,
    )  # fmt: skip
    o = kernels.attention(q[None], c.k[None], c.v[None], mask, cfg.head_dim**-0.5, pos + 1)
    return attn.output(o[0], gate)


def _pool_block(indexer, c: AttnCache, pos: torch.Tensor, rotary, kernels) -> None:
    """The pooled key of the block that holds pos, from its keys so far (the kernels'
    pool_block_at: the block_keys of shared rounds, for one block found on the device); a
    position past the last whole block (a capacity off the block grid) writes nothing."""
    blk, nb = indexer.cfg.indexer_block, c.block_keys.shape[0]
    if nb == 0:
        return
    first = torch.div(pos, blk, rounding_mode="floor") * blk
    cos, sin = rotary.cos_sin(first, c.block_keys.dtype)
    norm = indexer.k_layernorm
    kernels.pool_block_at(c.index_keys, c.block_keys, pos, cos, sin, norm.weight, norm.eps, blk)


class LoneDriver:
    """Runs `step` for one session at a time, graphed on CUDA, with two steps in flight."""

    def __init__(self, model: FlashNext, sessions: list[SessionState], graphs: bool = True,
                 drafter=None, max_steps: int = 64):
        """`drafter` (drafting.mtp.MtpDrafter): a drafting stream's steps queue their cells
        there, as kept shared rounds do, so its MTP head catches up when it drafts again."""
        self.model, self.sessions, self.drafter = model, sessions, drafter
        self.max_steps = max_steps
        dev = model.embed_tokens.weight.device
        width = model.cfg.hc_count * model.cfg.hidden_size
        self.rows = torch.zeros(max_steps, width, dtype=model.dtype, device=dev)
        self.k = torch.zeros(1, dtype=torch.long, device=dev)
        self.is_cuda = dev.type == "cuda"
        self.use_graphs = graphs and self.is_cuda
        self.tok = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(2, dtype=torch.long, device=dev)
        self.ring = torch.zeros(RING, 2, dtype=torch.long, pin_memory=self.is_cuda)
        self.events = [torch.cuda.Event() for _ in range(RING)] if self.is_cuda else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # session id -> its captured step
        # one memory pool for every session's graph: they never run at once, and a step's
        # results go to the static buffers above, so no replay overwrites memory in use
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.capture_seconds = 0.0
        self.failed: str | None = None  # why the steps run eagerly, if a capture failed
        self.num_steps = 0

    def decode(self, session_id: int, token: int, position: int, budget: int,
               take: Callable[[int, bool], bool], stream_id: int = -1, draws=None) -> int:
        """Up to `budget` steps from the pending `token` at `position`. After each landed step
        take(id, finite) says whether to go on; once it says no, the step still in flight
        lands and is handed over too. Returns the steps whose tokens the session now holds.
        With `draws` of a drafting stream, the steps' cells are queued for its MTP head."""
        budget = min(budget, self.max_steps)
        if budget <= 0:
            return 0
        s = self.sessions[session_id]
        self.tok.fill_(token)
        self.pos.fill_(position)
        self.k.zero_()
        tokens = [token]
        run = self._runner(session_id, s)
        launched = landed = 0
        going = True
        while landed < launched or (going and launched < budget):
            if going and launched < budget and launched - landed < 2:
                run()
                self._post(launched)
                launched += 1
                if launched - landed < 2 and launched < budget:
                    continue  # put a second step in flight before reading the first
            token_id, finite = self._read(landed)
            landed += 1
            tokens.append(token_id)
            going = take(token_id, finite) and going
        s.length = position + launched
        self.num_steps += launched
        drafter = self.drafter
        if draws is not None and draws.params.draft and drafter is not None and drafter.enabled:
            rows = self.rows[:launched].clone()  # the next call overwrites the buffer
            drafter.absorb_later(stream_id, rows, tokens[:launched], tokens[launched], draws)
        return launched

    def capture_all(self) -> int:
        """Capture every session's step now (engine start), so no request pays a capture;
        returns how many graphs there are. If a capture fails, lone steps run eagerly (same
        bits, more launches) and `failed` says why."""
        for session_id, s in enumerate(self.sessions):
            if self.use_graphs and session_id not in self.graphs:
                try:
                    self.graphs[session_id] = self._capture(s)
                except Exception as err:
                    self._give_up(err)
        return len(self.graphs)

    def _post(self, i: int) -> None:
        """Step i's (id, finite) into its ring slot, without waiting for it."""
        slot = self.ring[i % RING]
        slot.copy_(self.out, non_blocking=True)
        if self.is_cuda:
            self.events[i % RING].record()

    def _read(self, i: int) -> tuple[int, bool]:
        if self.is_cuda:
            self.events[i % RING].synchronize()
        token_id, finite = self.ring[i % RING].tolist()
        return token_id, bool(finite)

    def _runner(self, session_id: int, s: SessionState) -> Callable[[], None]:
        if not self.use_graphs:
            return lambda: self._step(s)
        graph = self.graphs.get(session_id)
        if graph is None:
            try:
                graph = self.graphs[session_id] = self._capture(s)
            except Exception as err:  # a step that cannot be captured runs eagerly from now on
                self._give_up(err)
                return self._runner(session_id, s)
        return graph.replay

    def _give_up(self, err: Exception) -> None:
        self.use_graphs, self.failed = False, f"{type(err).__name__}: {err}"
        self.graphs.clear()
        torch.cuda.synchronize()

    def _step(self, s: SessionState) -> None:
        step(self.model, s, self.tok, self.pos, self.out, (self.rows, self.k))

    def _capture(self, s: SessionState) -> torch.cuda.CUDAGraph:
        """Capture the session's step (a capture records work: s is not touched). Before the
        first capture one step runs on a small scratch session, so that every kernel is
        compiled and the allocator warm (no kernel is specialised on a session's capacity)."""
        t = time.perf_counter()
        if not self.graphs:
            self._warm(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._step(s)
        self.capture_seconds += time.perf_counter() - t
        return graph

    def _warm(self, like: SessionState) -> None:
        cfg = self.model.cfg
        capacity = min(like.capacity, 2 * cfg.indexer_block)
        scratch = SessionState.empty(cfg, capacity, like.attn_dtype(), like.state_dtype(),
                                     self.tok.device)
        saved = [x.clone() for x in (self.tok, self.pos, self.k)]
        self.pos.zero_()
        self.k.zero_()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._step(scratch)
        torch.cuda.current_stream().wait_stream(side)
        for live, value in zip((self.tok, self.pos, self.k), saved):
            live.copy_(value)
