"""A chat reply as a sequence of blocks (thinking, text, tool call), as the Anthropic Messages
and OpenAI Responses APIs present it, built from the reply parser's deltas as they stream.

Each feed returns the events that became certain: a block opens, grows by a piece of text,
or closes. A tool call arrives whole (the parser releases it at "</tool_call>"), so it opens,
carries its arguments in one piece and closes at once. A whole reply is one feed and a close,
so the blocks a client assembles from the stream equal the non-streamed reply's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flashlane.server.reply import ReplyDelta
from flashlane.server.tool_calls import ParsedToolCall

BlockKind = Literal["thinking", "text", "tool"]
EventKind = Literal["open", "delta", "close"]


@dataclass(slots=True)
class Block:
    index: int  # its place among the reply's blocks
    kind: BlockKind
    text: str = ""  # thinking or text so far; a tool call's arguments (a JSON object)
    call: ParsedToolCall | None = None  # tool blocks only


@dataclass(frozen=True, slots=True)
class BlockEvent:
    kind: EventKind
    block: Block
    text: str = ""  # the piece a delta adds


class BlockWriter:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._open: Block | None = None

    @property
    def has_tool_calls(self) -> bool:
        return any(b.kind == "tool" for b in self.blocks)

    def feed(self, delta: ReplyDelta) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        if delta.reasoning:
            self._grow("thinking", delta.reasoning, events)
        if delta.content:
            self._grow("text", delta.content, events)
        for call in delta.tool_calls:
            self._close(events)
            block = self._new("tool", call)
            block.text = call.arguments
            events += [BlockEvent("open", block), BlockEvent("delta", block, call.arguments)]
            self._close(events)
        return events

    def close(self) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        self._close(events)
        return events

    def _grow(self, kind: BlockKind, text: str, events: list[BlockEvent]) -> None:
        if self._open is None or self._open.kind != kind:
            self._close(events)
            events.append(BlockEvent("open", self._new(kind)))
        assert self._open is not None
        self._open.text += text
        events.append(BlockEvent("delta", self._open, text))

    def _new(self, kind: BlockKind, call: ParsedToolCall | None = None) -> Block:
        self._open = Block(len(self.blocks), kind, call=call)
        self.blocks.append(self._open)
        return self._open

    def _close(self, events: list[BlockEvent]) -> None:
        if self._open is not None:
            events.append(BlockEvent("close", self._open))
            self._open = None
