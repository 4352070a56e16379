"""The engine's periodic stats line (server/stats_log.py): what the rounds since the last
line did, once an interval has passed, and nothing when it is 0."""

import logging
import types

import pytest

from flashlane.server.stats_log import StatsLog


def fake_host(rounds, rows, shared, lone, filling=(), waiting=0):
    live = [types.SimpleNamespace(is_filling=f) for f in filling]
    counts = {"rounds": rounds, "piece_rows": rows, "shared_s": shared, "lone_s": lone}
    return types.SimpleNamespace(counts=counts, live=live, waiting=[None] * waiting, lone=None)


def test_a_line_per_interval_from_the_counts_since_the_last():
    now = [0.0]
    stats = StatsLog(5.0, clock=lambda: now[0])
    now[0] = 2.0
    assert stats.round_done(fake_host(3, 128, 1.0, 0.5), 0.4, 10) is None  # not yet
    now[0] = 5.0
    line = stats.round_done(fake_host(8, 1024, 3.0, 1.5, (True, False, False), 2), 0.3, 15)
    assert line == (
        "engine: 8 rounds in 5.0 s (shared 3.0 s, lone 1.5 s); prompt 205 rows/s, out 5.0"
        " tok/s; 2 decoding, 1 filling, 2 waiting; longest round 400 ms"
    )
    now[0] = 10.0  # the next line counts from the last one
    line = stats.round_done(fake_host(10, 1024, 3.5, 2.5, (False,)), 0.1, 50)
    assert line.startswith("engine: 2 rounds in 5.0 s (shared 0.5 s, lone 1.0 s); prompt 0")
    assert "out 10.0 tok/s; 1 decoding, 0 filling, 0 waiting; longest round 100 ms" in line


def test_no_line_at_interval_zero_and_a_negative_one_refused():
    stats = StatsLog(0.0, clock=lambda: 1e9)
    assert stats.round_done(fake_host(1, 0, 0.0, 0.0), 1.0, 1) is None
    with pytest.raises(ValueError, match="log-stats-interval"):
        StatsLog(-1.0)


def test_serve_takes_the_flag():
    import argparse

    from flashlane.server.flags import add_serve_flags

    parser = argparse.ArgumentParser()
    add_serve_flags(parser)
    assert parser.parse_args([]).log_stats_interval == 10.0
    assert parser.parse_args(["--log-stats-interval", "1"]).log_stats_interval == 1.0
    assert parser.parse_args(["--disable-log-stats"]).log_stats_interval == 0.0


def test_first_use_costs_are_named(monkeypatch, caplog):
    from flashlane.kernels import compiles

    built = [5]
    monkeypatch.setattr(compiles, "count", lambda: built[0])
    specs = [("_attn", "_attn[num_warps=4](M: i32)"), ("_norm", "_norm[num_warps=2](N: i32)")]
    monkeypatch.setattr(compiles, "since", lambda before: (specs * 2)[: built[0] - before])
    monkeypatch.setattr(compiles, "earlier", lambda name, spec: ["v0"] if name == "_norm" else [])
    now = [0.0]
    stats = StatsLog(1.0, clock=lambda: now[0])
    host = fake_host(2, 0, 1.0, 0.0)
    host.lone = types.SimpleNamespace(capture_seconds=0.0)
    built[0], now[0] = 7, 0.5
    with caplog.at_level(logging.INFO, logger="flashlane.engine"):
        # each compile's specialisation at once (for the warm rounds to cover), the line later
        assert stats.round_done(host, 5.0, 1) is None
        assert caplog.text.count("compiled while serving:") == 2
        built[0], host.lone.capture_seconds, now[0] = 9, 4.5, 1.0
        line = stats.round_done(host, 0.5, 1)
    assert line.endswith(
        "longest round 5,000 ms; 4 Triton compiles (_attn, _norm), graph captures 4.5 s"
    )
    assert (
        caplog.text.count("compiled while serving: _attn[num_warps=4](M: i32); before it: none")
        == 2
    )
    assert caplog.text.count("_norm[num_warps=2](N: i32); before it: v0") == 2
    assert caplog.text.count("compiled while serving:") == 4
    now[0] = 2.0
    assert stats.round_done(host, 0.01, 1).endswith("longest round 10 ms")


def test_a_start_leaves_out_what_came_before(monkeypatch):
    from flashlane.kernels import compiles

    monkeypatch.setattr(compiles, "count", lambda: 165)
    now = [0.0]
    stats = StatsLog(1.0, clock=lambda: now[0])
    host = fake_host(40, 900, 30.0, 5.0)
    host.lone = types.SimpleNamespace(capture_seconds=35.0)
    now[0] = 60.0
    stats.start(host)  # after the load and the warm rounds
    now[0] = 61.0
    line = stats.round_done(fake_host(42, 964, 30.5, 5.2), 0.3, 20)
    assert line.startswith("engine: 2 rounds in 1.0 s (shared 0.5 s, lone 0.2 s); prompt 64")
    assert line.endswith("longest round 300 ms")  # no compile, no capture since the start
