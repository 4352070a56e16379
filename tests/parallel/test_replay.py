"""ReplayedBackend and serve without processes: a fake group queues rank 0's broadcasts, and
a recording backend on each side shows that the other rank makes the same calls, with
windows whose id lists match rank 0's at each call (they grow between calls)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from flashlane.lanes.records import Draws, Window
from flashlane.parallel.replay import ReplayedBackend, serve
from flashlane.request import SamplingParams


@dataclass
class FakeGroup:
    queue: deque
    rank: int = 0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj=None):
        if self.is_leader:
            self.queue.append(obj)
            return obj
        return self.queue.popleft()


@dataclass
class Recording:
    """Each call with what it saw: the windows' ids and, for every stream it knows, its lists."""

    calls: list = field(default_factory=list)
    draws: dict = field(default_factory=dict)
    drafter = None

    def _seen(self) -> dict:
        return {s: (list(d.prompt_ids), list(d.reply_ids)) for s, d in self.draws.items()}

    def verify(self, windows):
        for w in windows:
            self.draws[w.stream_id] = w.draws
        self.calls.append(("verify", [(w.stream_id, w.tokens) for w in windows], self._seen()))
        return []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, args, self._seen()))
            if name == "release":
                self.draws.pop(args[0], None)

        return call


def test_the_other_rank_makes_rank_0s_calls_on_the_same_lists():
    queue: deque = deque()
    leader, worker = Recording(), Recording()
    backend = ReplayedBackend(leader, FakeGroup(queue))
    prompt, reply = [5, 6, 7], [9]
    draws = Draws(SamplingParams(temperature=0.7), 11, prompt, reply)
    other = Draws(SamplingParams(), 3, [1, 2], [4])
    backend.verify([Window(0, 0, 3, (9,), draws), Window(1, 1, 2, (4,), other)])
    reply.append(8)  # the core's pending token, before keep
    backend.keep({0: 1, 1: 1})
    backend.draft({0: 2})
    reply += [2, 2]
    backend.verify([Window(0, 0, 4, (8, 2), draws)])
    reply[-1] = 3  # a replaced tail is sent again whole
    backend.keep({0: 2})
    backend.release(1, False)
    backend.move(0, 1)
    backend.keep_state(0, 4)
    backend.close()
    made = serve(worker, FakeGroup(queue, rank=1))
    assert made == len(leader.calls) == 8
    assert worker.calls == leader.calls
    assert worker.calls[4][2][0] == ([5, 6, 7], [9, 8, 2, 3])


def test_a_failing_call_on_the_other_rank_does_not_end_its_loop():
    queue: deque = deque()
    backend = ReplayedBackend(Recording(), FakeGroup(queue))
    backend.keep({7: 1})
    backend.drop_state(3)
    backend.close()

    class Failing(Recording):
        def keep(self, kept):
            raise ValueError("unknown stream 7")

    worker = Failing()
    assert serve(worker, FakeGroup(queue, rank=1)) == 2
    assert [c[0] for c in worker.calls] == ["drop_state"]
