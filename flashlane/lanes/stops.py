"""Concluding a window: take its accepted tokens one by one, as serial decoding would.

Every rule here looks at the reply token by token, never at how the tokens arrived (drafted,
forced, bonus), so a drafted reply stops, and forces its thinking close, exactly where the
serial reply does. When a rule ends the reply or starts forcing the close, the rest of the
window's tokens are dropped: they were drawn for positions the serial reply fills otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from flashlane.lanes.stream import Stream

# The loop guard: a cycle of at most MAX_CYCLE tokens filling the last LOOP_SPAN thinking tokens.
LOOP_SPAN = 256
MAX_CYCLE = 16


@dataclass(frozen=True, slots=True)
class StopRules:
    """What ends or steers a reply besides its params: the model's and tokenizer's facts."""

    eos_ids: frozenset[int] = frozenset()
    # Forced when a budgeted thinking is spent or loops: the ids of "\n</think>\n\n".
    think_close_ids: tuple[int, ...] = ()
    think_end_id: int | None = None  # "</think>": thinking is over when the model emits it
    # ids -> text (special tokens skipped): the reply's text and its stop strings
    detokenize: Callable[[list[int]], str] | None = None


def begin(stream: Stream, rules: StopRules) -> None:
    """A new stream: a thinking budget starts it thinking; a budget of 0 forces the close now,
    replacing even the prompt's draw."""
    budget = stream.params.thinking_budget
    if budget is None or not rules.think_close_ids:
        return
    stream.is_thinking = True
    stream.cycle_runs = [0] * MAX_CYCLE
    if budget <= 0:
        _force_close(stream, rules)


def conclude(
    stream: Stream,
    path: Sequence[int],
    rules: StopRules,
    logprobs: Sequence[dict[int, float]] | None = None,
) -> int:
    """Append the accepted `path` to the reply until a rule cuts it; returns tokens taken.
    `logprobs[i]`, where given, belongs to path[i] (the draw for its position)."""
    taken = len(path)
    for i, token in enumerate(path):
        if not _take(stream, token, rules):
            taken = i + 1
            break
    if stream.logprobs is not None:
        given = list(logprobs[:taken]) if logprobs else []
        stream.logprobs.extend(given + [{}] * (taken - len(given)))
    return taken


def _take(stream: Stream, token: int, rules: StopRules) -> bool:
    """Append one token; False when the window's later tokens must be dropped."""
    stream.reply_ids.append(token)
    if stream.forced:
        stream.forced.pop(0)
    if stream.is_thinking:
        _think(stream, token, rules)
    reason = _finish_reason(stream, token, rules)
    if reason is not None:
        stream.end(reason)
        return False
    if stream.is_thinking and _thinking_spent(stream):
        _force_close(stream, rules)
        return False
    return True


def _think(stream: Stream, token: int, rules: StopRules) -> None:
    if token == rules.think_end_id:
        stream.is_thinking = False
        return
    stream.thinking += 1
    reply, runs = stream.reply_ids, stream.cycle_runs
    for p in range(1, MAX_CYCLE + 1):
        runs[p - 1] = runs[p - 1] + 1 if len(reply) > p and reply[-1 - p] == token else 0


def _thinking_spent(stream: Stream) -> bool:
    if stream.thinking >= stream.params.thinking_budget:
        return True
    return any(run >= LOOP_SPAN - p for p, run in enumerate(stream.cycle_runs, 1))


def _force_close(stream: Stream, rules: StopRules) -> None:
    stream.is_thinking = False
    stream.forced = list(rules.think_close_ids)
    stream.held = None


def _finish_reason(stream: Stream, token: int, rules: StopRules) -> str | None:
    params = stream.params
    if token in rules.eos_ids and not params.ignore_eos:
        return "stop"
    if params.stop_token_ids and token in params.stop_token_ids:
        return "stop"
    if _hit_stop_string(stream, token):
        return "stop"
    if len(stream.reply_ids) >= params.max_tokens or stream.start >= max(
        stream.capacity, stream.max_capacity
    ):
        return "length"
    return None


def _hit_stop_string(stream: Stream, token: int) -> bool:
    """Whether the reply's text now holds a stop string. Without stop strings the text is
    not needed token by token: `read_text` decodes it when the host reports (two decodes a
    token were half of a lone step's host work at 64 streams on this VM's CPU)."""
    if stream.detok is None or stream.matcher is None:
        return False
    stream.detok.add((token,))
    check = stream.matcher.check(stream.detok.text)
    stream.num_final_chars = check.visible
    stream.stop_string = check.stop
    return check.stop is not None


def read_text(stream: Stream) -> None:
    """The reply's text up to its last token, where no stop string reads it token by token
    (`_hit_stop_string`): the tokens since the last call in one add."""
    d = stream.detok
    if d is None or stream.matcher is not None:
        return
    if len(d.token_ids) < len(stream.reply_ids):
        d.add(stream.reply_ids[len(d.token_ids) :])
    stream.num_final_chars = len(d.text)


def finish_text(stream: Stream) -> None:
    """At the reply's end: release the text held back for a partial character or a possible
    stop string, unless a stop string cut it."""
    if stream.detok is None or stream.stop_string is not None:
        return
    read_text(stream)
    stream.detok.flush()
    text = stream.detok.text
    check = stream.matcher.check(text) if stream.matcher is not None else None
    stream.num_final_chars = check.visible if check and check.stop else len(text)
