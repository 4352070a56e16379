"""AsyncEngine: the Engine on its own thread, streamed to asyncio callers.

The engine thread owns the lane host: it takes submissions and aborts from an inbox, runs
rounds while there is work, and hands each request's cumulative RequestOutput to that
request's asyncio queue with call_soon_threadsafe. The event loop never waits on the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from flashlane.config import DEFAULT_MODEL, EngineConfig
from flashlane.engine import Engine
from flashlane.kernels import compiles, row_kind
from flashlane.lanes.host import QueueFull as HostQueueFull
from flashlane.lanes.outputs import output
from flashlane.lanes.records import CHUNK, CostTable
from flashlane.lanes.warm_start import warm_start
from flashlane.models.flashnext import run_piece
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.state import SessionState
from flashlane.request import FinishReason, RequestOutput, SamplingParams
from flashlane.runner.heap import freeze_heap
from flashlane.server.engine_api import EngineFailed, QueueFull
from flashlane.server.stats_log import StatsLog

_DONE = object()
log = logging.getLogger("flashlane.engine")


class AsyncEngine:
    def __init__(
        self,
        model: str | None = None,
        *,
        costs: CostTable | None = None,
        served_model_name: str | None = None,
        built=None,
        log_stats_interval: float = 0.0,
        **options: Any,
    ):
        """`built`: (config, model) made elsewhere (`flashlane serve --random-weights`),
        served with the embedded model's tokenizer; `log_stats_interval`: seconds between
        the engine's stats lines (server/stats_log.py; 0: none)."""
        self._stats = StatsLog(log_stats_interval)
        self.config = EngineConfig.resolve(model=model, **options)
        self.engine = Engine(
            self.config,
            costs=costs,
            built=built,
            tokenizer_from=DEFAULT_MODEL if built is not None else None,
        )
        e = self.engine
        self.tokenizer = e.tokenizer
        self.model_vocab_size = e.model_config.vocab_size  # the ids the model embeds
        self.model_name = served_model_name or e.name
        # what a request may hold: the largest session less the verify window the host keeps
        self.context_len = e.host.sessions.max_model_len
        self.generation_defaults = e.generation_defaults
        self.chat_template = e.chat_template
        self.seeds = e.seeds
        self.chat_template_kwargs = self.config.chat_template_kwargs
        self.eos_token_ids = sorted(e.host.rules.eos_ids)
        self._inbox: queue.Queue = queue.Queue()
        # a lone call ends after its next step when requests or aborts wait in the inbox,
        # instead of after its whole budget
        e.host.interrupted = lambda: not self._inbox.empty()
        self._streamed = 0  # tokens a lone call delivered before its round ended
        if e.device.startswith("cuda"):  # no request pays a compile or a capture
            try:
                secs = warm_start(e.host, self.model_vocab_size)
                log.info(f"engine: warm rounds in {secs:.1f} s")
            except Exception as err:  # the engine serves; first requests pay the first uses
                log.warning(f"engine: warm rounds stopped ({type(err).__name__}: {err})")
        self._stats.start(e.host)  # the first stats line counts from here
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        # cumulative; the per-request ones are counted when a request ends
        self._counters = dict.fromkeys(
            ("drafted", "accepted", "rounds", "moves", "pauses", "preemptions"), 0
        )
        self._closed = threading.Event()
        self.error: str | None = None  # set when the engine thread has failed (engine_api)
        e.host.on_updates = self._deliver  # a lone call's tokens as it lands them
        self._thread = threading.Thread(target=self._run, name="flashlane-engine", daemon=True)
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------
    async def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        boundaries: Sequence[int] = (),
    ) -> AsyncIterator[RequestOutput]:
        if params.n != 1:
            raise ValueError(
                "AsyncEngine.stream runs one choice: stream n requests, choice j "
                "with seed + j (LLM.generate gathers them)"
            )
        loop = asyncio.get_running_loop()
        sink: asyncio.Queue = asyncio.Queue()
        accepted: Future = Future()
        submit = (request_id, list(prompt_ids), params, list(boundaries))
        if self.error is not None:
            raise EngineFailed(self.error)
        self._inbox.put(("submit", *submit, (loop, sink), accepted))
        if self.error is not None:  # failed meanwhile: no engine thread will take it
            self._refuse_inbox()
        await asyncio.wrap_future(accepted)  # raises QueueFull / ValueError as submitted
        try:
            while True:
                item = await sink.get()
                if item is _DONE:
                    return
                yield item
        finally:
            self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def stats(self) -> dict[str, float]:
        host = self.engine.host
        return {
            "sessions_busy": len(host.live),
            "sessions_total": len(self.engine.sessions),
            "queue": len(host.waiting),
            "prompt_cache_queries": host.cache.num_queries,
            "prompt_cache_hits": host.cache.num_hits,
            "prompt_cache_hit_tokens": host.cache.num_hit_tokens,
            "prompt_cache_query_tokens": host.cache.num_query_tokens,
            "kv_cache_usage": self._kv_cache_usage(),
            "prompt_cache_bytes": host.cache.num_bytes,
            "prompt_cache_capacity_bytes": host.cache.capacity_bytes,
            **self._counters,
        }

    def _kv_cache_usage(self) -> float:
        """The share of all sessions' positions that live streams hold (0..1), vLLM's
        kv_cache_usage_perc (our sessions are allocated whole, so this is their fill)."""
        total = sum(self.engine.plan.capacities)
        held = sum(s.start for s in list(self.engine.host.live))
        return held / total if total else 0.0

    def prompt_logprobs(self, ids: list[int], top: int) -> list[dict[int, float] | None]:
        """Teacher-forced logprobs of each prompt token (None for the first), on a scratch
        session of the caller's thread: the model's weights are only read."""
        e = self.engine
        t = torch.tensor(ids, dtype=torch.long)
        s = SessionState.empty(
            e.model_config,
            len(ids),
            e.sessions[0].attn_dtype(),
            e.sessions[0].state_dtype(),
            e.device,
            kv_fp8=e.sessions[0].kv_fp8,
        )
        # prompt rows, as the engine's prompt pieces compute them (kernels/row_kind.py)
        kinds = row_kind.uniform(True) if fp8_weights(e.model) else contextlib.nullcontext()
        with kinds:
            # a prompt of one piece is a whole prompt, as the engine runs it (Piece.whole)
            one = len(ids) <= CHUNK
            pieces = range(0, len(ids), CHUNK)
            logits = torch.cat(
                [run_piece(e.model, s, t[a : a + CHUNK], a, False, one) for a in pieces]
            )
        lp = torch.log_softmax(logits.double(), dim=-1)
        out: list[dict[int, float] | None] = [None]
        for i in range(1, len(ids)):
            best = torch.topk(lp[i - 1], top).indices.tolist() if top else []
            out.append({j: float(lp[i - 1, j]) for j in [*best, ids[i]]})
        return out

    def close(self) -> None:
        self._closed.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=10)

    # -- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the engine is broken: nothing it holds can go on
            log.exception("the engine thread failed")
            self._fail(f"the engine failed: {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        """Ends every request in flight with an error, refuses those waiting in the inbox, and
        marks the engine failed (the server then answers 503 and exits)."""
        for rid in list(self._sinks):
            out = RequestOutput(rid, [], [], "", FinishReason.ERROR, 0, error=message)
            self._send(rid, out, True)
        self.error = message
        self._refuse_inbox()

    def _refuse_inbox(self) -> None:
        assert self.error is not None
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "submit" and not item[-1].done():
                item[-1].set_exception(EngineFailed(self.error))

    def _serve(self) -> None:
        host = self.engine.host
        while not self._closed.is_set():
            self._take_inbox(block=not host.has_work)
            if not host.has_work:
                continue
            started, self._streamed = time.perf_counter(), 0
            self._deliver(host.run_once())
            self._counters["rounds"] += 1
            self._stats.round_done(host, time.perf_counter() - started, self._streamed)

    def _deliver(self, updates) -> None:
        """Each update to its request's stream (a lone call's too, as it lands tokens)."""
        for u in updates:
            self._streamed += len(u.token_ids)
            self._send(u.stream.request_id, output(u.stream), u.finish is not None)

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item: tuple) -> None:
        host = self.engine.host
        if item[0] == "submit":
            _, rid, ids, params, boundaries, sink, accepted = item
            try:
                host.submit(rid, ids, params, boundaries=boundaries)
            except HostQueueFull as err:
                accepted.set_exception(QueueFull(str(err)))
                return
            except Exception as err:
                accepted.set_exception(err)
                return
            self._sinks[rid] = sink
            accepted.set_result(None)
        elif item[0] == "abort" and item[1] in self._sinks:
            host.cancel(item[1])

    def _send(self, rid: str, out: RequestOutput, done: bool) -> None:
        sink = self._sinks.get(rid)
        if sink is None:
            return
        loop, q = sink
        if done:
            del self._sinks[rid]
            self._counters["drafted"] += out.stats.drafted
            self._counters["accepted"] += out.stats.accepted
            self._counters["moves"] += out.stats.moves
            self._counters["pauses"] += out.stats.pauses
            self._counters["preemptions"] += out.stats.preemptions
        try:
            loop.call_soon_threadsafe(q.put_nowait, out)
            if done:
                loop.call_soon_threadsafe(q.put_nowait, _DONE)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            self._sinks.pop(rid, None)


def start_engine(args) -> AsyncEngine:
    """The engine `flashlane serve` runs, from its parsed flags."""
    from flashlane.flags import engine_options, model_of

    compiles.count()  # the compile hook from the start: served compiles name earlier variants
    opts = engine_options(args)
    built = random_model(args, opts) if getattr(args, "random_weights", False) else None
    engine = AsyncEngine(
        model=model_of(args),
        served_model_name=getattr(args, "served_model_name", None),
        built=built,
        log_stats_interval=getattr(args, "log_stats_interval", 0.0),
        **opts,
    )
    if engine.engine.device.startswith("cuda"):
        freeze_heap()  # runner/heap.py: no full collection walks the engine's objects
    return engine


def random_model(args, opts: dict):
    """`--config NAME --random-weights`: the preset (or config.json) with random weights made
    on the engine's device, in its compute dtype (a benchmark's model: no file read)."""
    from flashlane.engine import compute_dtypes
    from flashlane.engine_plan import table_dtype_for
    from flashlane.models.config import ModelConfig
    from flashlane.models.presets import config_dict
    from flashlane.models.random_weights import build_random, random_table_place

    device = EngineConfig.resolve(**opts).resolved_device()
    weights, _, _ = compute_dtypes(device, opts.get("dtype") or "auto")
    raw, quantize = config_dict(args.config), opts.get("quantization")
    asked = opts.get("ple_table_dtype") or "auto"
    tables = random_table_place(raw, device, quantize, opts.get("ple_table_device"), asked)
    table_dtype = table_dtype_for(asked, ModelConfig.from_hf(raw), tables, weights.itemsize)
    return build_random(
        raw, weights, device, args.weights_seed, quantize, tables, table_dtype=table_dtype
    )
