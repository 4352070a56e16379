"""Splitting a chat reply into reasoning, content and tool calls, as it streams.

The same parser serves streamed and whole replies (a whole reply is one feed), so the pieces a
client assembles from the stream equal the non-streamed message. Text that may still turn out to
be a tag (the start of "</think>" or "<tool_call>") is held back until it is decided.

Whitespace: reasoning loses its leading and trailing whitespace (the template's "<think>\n" and
"\n</think>"); content loses leading whitespace, and the whitespace just before a tool call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from flashlane.server.tool_calls import ParsedToolCall, parse_tool_call

THINK_START, THINK_END = "<think>", "</think>"
TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"

Mode = Literal["start", "reasoning", "content", "tool"]


@dataclass(slots=True)
class ReplyDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ReplyDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


class ReplyParser:
    """Feed the reply's final text piece by piece; each feed returns what became certain."""

    def __init__(
        self,
        *,
        in_reasoning: bool = False,
        parse_tools: bool = False,
        schemas: dict[str, dict[str, Any]] | None = None,
        parallel_tool_calls: bool = True,
    ) -> None:
        # in_reasoning: the prompt opened "<think>", so the reply starts inside thinking
        self._mode: Mode = "reasoning" if in_reasoning else "start"
        self._parse_tools = parse_tools
        self._schemas = schemas or {}
        self._parallel = parallel_tool_calls
        self._buf = ""
        self._lead = True  # at the start of a reasoning or content run: drop whitespace
        self.num_tool_calls = 0
        self.had_reasoning = in_reasoning

    @property
    def in_reasoning(self) -> bool:
        return self._mode == "reasoning"

    def feed(self, text: str) -> ReplyDelta:
        self._buf += text
        out = ReplyDelta()
        while self._buf and self._step(out, final=False):
            pass
        return out

    def finish(self) -> ReplyDelta:
        """The reply is over: release what was held (an unclosed tool call becomes content)."""
        out = ReplyDelta()
        while self._buf and self._step(out, final=True):
            pass
        if self._mode == "tool":
            out.content += TOOL_START + self._buf
        elif self._mode == "content":
            out.content += self._buf
        self._buf = ""
        return out

    def _step(self, out: ReplyDelta, final: bool) -> bool:
        """Consumes part of the buffer; False when the rest must wait for more text."""
        if self._mode == "start":
            return self._start(final)
        if self._mode == "reasoning":
            return self._reasoning(out, final)
        if self._mode == "content":
            return self._content(out, final)
        return self._tool(out)

    def _start(self, final: bool) -> bool:
        head = self._buf.lstrip()
        if head.startswith(THINK_START):
            self._buf = head[len(THINK_START) :]
            self._mode, self._lead, self.had_reasoning = "reasoning", True, True
            return True
        if not final and (not head or THINK_START.startswith(head)):
            return False
        self._mode = "content"
        return True

    def _reasoning(self, out: ReplyDelta, final: bool) -> bool:
        if self._lead:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._lead = False
        end = self._buf.find(THINK_END)
        if end >= 0:
            out.reasoning += self._buf[:end].rstrip()
            self._buf = self._buf[end + len(THINK_END) :]
            self._mode, self._lead = "content", True
            return True
        keep = len(self._buf.rstrip()) if final else _safe_len(self._buf, THINK_END)
        out.reasoning += self._buf[:keep]
        self._buf = "" if final else self._buf[keep:]
        return False

    def _content(self, out: ReplyDelta, final: bool) -> bool:
        if self._lead:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._lead = False
        if not self._parse_tools:
            out.content += self._buf
            self._buf = ""
            return False
        start = self._buf.find(TOOL_START)
        if start >= 0:
            out.content += self._buf[:start].rstrip()
            self._buf = self._buf[start + len(TOOL_START) :]
            self._mode = "tool"
            return True
        if final:
            return False
        keep = _safe_len(self._buf, TOOL_START)
        out.content += self._buf[:keep]
        self._buf = self._buf[keep:]
        return False

    def _tool(self, out: ReplyDelta) -> bool:
        end = self._buf.find(TOOL_END)
        if end < 0:
            return False
        body = self._buf[:end]
        self._buf = self._buf[end + len(TOOL_END) :]
        self._mode, self._lead = "content", True
        call = parse_tool_call(body, self._schemas)
        if call is None:
            out.content += TOOL_START + body + TOOL_END
        elif self._parallel or self.num_tool_calls == 0:
            out.tool_calls.append(call)
            self.num_tool_calls += 1
        return True


def _safe_len(text: str, tag: str) -> int:
    """How much of `text` is certainly neither part of `tag` nor whitespace that may precede it."""
    keep = len(text)
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            keep = len(text) - n
            break
    return len(text[:keep].rstrip())
