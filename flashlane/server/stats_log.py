"""The engine's periodic stats line (`flashlane serve --log-stats-interval`), as vLLM logs
its throughput every few seconds: what the rounds since the last line did, from the lane
host's counters (LaneHost.counts) and its streams.

    engine: 41 rounds in 5.0 s (shared 3.9 s, lone 1.1 s); prompt 2,048 rows/s, out 310.4
    tok/s; 12 decoding, 4 filling, 0 waiting; longest round 402 ms

and, where rounds met new shapes, the Triton compiles (each kernel named, and logged at once
with its specialisation: what the warm rounds did not compile) and the lone driver's graph
captures.
"""

from __future__ import annotations

import logging
import time

from flashlane.kernels import compiles

log = logging.getLogger("flashlane.engine")


class StatsLog:
    def __init__(self, interval: float, clock=time.monotonic) -> None:
        """`interval`: seconds between lines (0: none)."""
        if interval < 0:
            raise ValueError(f"--log-stats-interval must be >= 0, got {interval}")
        self.interval, self.clock = interval, clock
        self.start(None)

    def start(self, host) -> None:
        """Count from now: from `host`'s counters, Triton compiles and graph captures so far
        (None: from zero), so that the first line leaves out what came before (the load,
        the warm rounds)."""
        lone = getattr(host, "lone", None)
        counts = dict(host.counts) if host is not None else {}
        self.logged = compiles.count()  # compiles logged one by one up to here
        self._mark(self.clock(), counts, self.logged, getattr(lone, "capture_seconds", 0.0))

    def _mark(self, now: float, counts: dict, built: int, captured: float) -> None:
        self.since, self.last, self.compiles, self.captured = now, counts, built, captured
        self.tokens, self.longest = 0, 0.0

    def round_done(self, host, seconds: float, tokens: int) -> str | None:
        """After a round of `seconds` that delivered `tokens`: the line, logged, when the
        interval has passed (and rounds ran), else None."""
        if self.interval == 0:
            return None
        if compiles.count() > self.logged:  # at once, what the warm rounds did not compile
            for name, spec in compiles.since(self.logged):
                before = compiles.earlier(name, spec)
                again = " (this one too: it compiled again)" if spec in before else ""
                log.info("engine: compiled while serving: %s; before it%s: %s", spec, again,
                         " | ".join(before) if before else "none")  # fmt: skip
            self.logged = compiles.count()
        self.tokens += tokens
        self.longest = max(self.longest, seconds)
        now = self.clock()
        span = now - self.since
        if span < self.interval:
            return None
        counts = dict(host.counts)
        d = {k: v - self.last.get(k, 0) for k, v in counts.items()}
        decoding = sum(1 for s in host.live if not s.is_filling)
        built, captured = compiles.count(), getattr(host.lone, "capture_seconds", 0.0)
        new = compiles.since(self.compiles)
        names = f" ({', '.join(sorted({name for name, _ in new}))})" if new else ""
        first_use = (
            f"; {built - self.compiles} Triton compiles{names}, graph captures"
            f" {captured - self.captured:.1f} s"
            if built > self.compiles or captured > self.captured
            else ""
        )
        line = (
            f"engine: {d['rounds']:,.0f} rounds in {span:.1f} s (shared {d['shared_s']:.1f} s,"
            f" lone {d['lone_s']:.1f} s); prompt {d['piece_rows'] / span:,.0f} rows/s, out"
            f" {self.tokens / span:,.1f} tok/s; {decoding} decoding,"
            f" {len(host.live) - decoding} filling, {len(host.waiting)} waiting; longest round"
            f" {self.longest * 1e3:,.0f} ms{first_use}"
        )
        self._mark(now, counts, built, captured)
        log.info(line)
        return line
