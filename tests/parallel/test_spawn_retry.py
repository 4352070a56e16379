"""spawn_ranks (tests/parallel/ranks.py): a group whose rank dies of a signal is spawned again
on another port, up to SPAWN_TRIES in all; a rank's exception, or a death on every try,
fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

from tests.parallel.ranks import SPAWN_TRIES, spawn_ranks


def abort_once(rank: int, size: int, port: int, marker: str, log: str) -> None:
    if rank != 1:
        return
    with open(log, "a") as f:
        f.write(f"{port}\n")
    if not Path(marker).exists():
        Path(marker).touch()
        os.abort()


def always_abort(rank: int, size: int, port: int, log: str) -> None:
    if rank == 1:
        with open(log, "a") as f:
            f.write(f"{port}\n")
        os.abort()


def raise_error(rank: int, size: int, port: int) -> None:
    raise ValueError("a rank's own error")


def test_a_rank_killed_by_a_signal_is_spawned_again_on_another_port(tmp_path):
    log = tmp_path / "log"
    spawn_ranks(abort_once, 2, str(tmp_path / "marker"), str(log))
    assert len(log.read_text().splitlines()) == 2  # rank 1 of the first group, then the second


def test_a_death_on_every_try_and_a_ranks_exception_fail(tmp_path):
    log = tmp_path / "log"
    with pytest.raises(ProcessExitedException):
        spawn_ranks(always_abort, 2, str(log))
    assert len(log.read_text().splitlines()) == SPAWN_TRIES
    with pytest.raises(ProcessRaisedException, match="a rank's own error"):
        spawn_ranks(raise_error, 2)
