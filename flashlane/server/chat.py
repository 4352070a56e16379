"""Chat prompts: the checkpoint's jinja template rendered in a sandbox, and the reply's parser.

Templates come from the checkpoint and are run as untrusted code: jinja2's immutable sandbox,
with the helpers transformers gives templates (`tojson` without HTML escaping,
`raise_exception`, `strftime_now`, the `{% generation %}` tag) and nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flashlane.request import StructuredOutput
from flashlane.server.protocol import ApiError, ChatMessage, ChatRequest, NamedToolChoice
from flashlane.server.reply import THINK_END, THINK_START, TOOL_START, ReplyParser
from flashlane.server.structured import request_structured, tool_call_grammar

# Keys a request's chat_template_kwargs may not replace (with the special tokens' names and
# the template's globals): the request's own fields, set by the server.
_RESERVED = frozenset({"messages", "tools", "add_generation_prompt"})

# Message boundaries are computed for at most the first _HEAD and the last _TAIL messages:
# each one costs a render and a tokenization of the prompt up to it, so a long conversation
# pays for 8, not for all of them. The first ones are where conversations sharing a system
# prompt branch (and are short, so cheap); the last ones are where a chat extended by a turn
# leaves its previous request.
_HEAD, _TAIL = 2, 6


class ChatTemplate:
    """A compiled chat template: render(messages, tools, kwargs) -> the prompt text."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ValueError(f"the chat template does not compile: {e}") from e
        self._special = dict(special_tokens or {})
        self._reserved = _RESERVED | set(self._special) | set(env.globals)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        extra = dict(template_kwargs or {})
        taken = sorted(self._reserved.intersection(extra))
        if taken:
            msg = f"chat_template_kwargs may not set {', '.join(taken)}: the server sets them"
            raise ApiError(400, msg, param="chat_template_kwargs")
        try:
            return self._template.render(
                **self._special,
                **extra,
                messages=messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
            )
        except Exception as e:  # the template is fixed: what fails it is the request
            msg = f"the chat template failed: {type(e).__name__}: {str(e)[:500]}"
            raise ApiError(400, msg, param="messages") from None


class _GenerationTag(Extension):
    """transformers' {% generation %}...{% endgeneration %} marks assistant text; render as is."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """OpenAI messages as templates expect them: text content, tool arguments as mappings."""
    out = []
    for i, message in enumerate(messages):
        item = message.model_dump(exclude_none=True)
        if isinstance(message.content, list):
            parts = []
            for j, part in enumerate(message.content):
                if part.type != "text" or part.text is None:
                    msg = f"content part type {part.type!r} is not supported"
                    raise ApiError(400, msg, param=f"messages[{i}].content[{j}]")
                parts.append(part.text)
            item["content"] = "".join(parts)
        for call in item.get("tool_calls", ()):
            arguments = call["function"].get("arguments")
            if isinstance(arguments, str):
                try:
                    parsed = json.loads(arguments)
                except json.JSONDecodeError:
                    continue
                if isinstance(parsed, dict):
                    call["function"]["arguments"] = parsed
        out.append(item)
    return out


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A rendered chat request: the prompt text and how to read the reply."""

    text: str  # the prompt, ending with `reply_prefix`
    reply_prefix: str  # forced start of the reply (tool_choice required or named)
    in_reasoning: bool  # the reply starts inside <think> (opened by the template)
    parse_tools: bool
    parallel_tool_calls: bool
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the reply's constraint: the request's structured output, or a forced tool call's grammar
    structured: StructuredOutput | None = None

    def parser(self) -> ReplyParser:
        """A fresh reply parser that has already read the forced prefix."""
        parser = ReplyParser(
            in_reasoning=self.in_reasoning,
            parse_tools=self.parse_tools,
            schemas=self.schemas,
            parallel_tool_calls=self.parallel_tool_calls,
        )
        parser.feed(self.reply_prefix)
        return parser


def _prompt_tools(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The tools the template shows: none when tool_choice is none."""
    if not req.tools or (req.tool_choice or "auto") == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


def build_chat_prompt(
    template: ChatTemplate, req: ChatRequest, tag_ids: dict[str, int | None] | None = None
) -> ChatPrompt:
    """Renders the request; tool_choice none hides the tools, required/named forces a call
    (its start in the prompt, its rest by grammar). A constrained reply (a forced call or the
    request's structured output) starts after the thinking block, closed in the prompt.
    `tag_ids`: the tool-call tags' token ids (server/structured.tool_call_grammar)."""
    choice = req.tool_choice or "auto"
    structured = request_structured(req)
    tools = _prompt_tools(req)
    use_tools = tools is not None
    text = template.render(
        template_messages(req.messages),
        tools=tools,
        template_kwargs=req.chat_template_kwargs,
    )
    in_reasoning = text.rfind(THINK_START) > text.rfind(THINK_END)
    prefix = ""
    schemas = {t.function.name: t.function.parameters or {} for t in req.tools or ()}
    forced = use_tools and choice != "auto"
    if forced and structured is not None:
        msg = "a forced tool_choice and a structured output both constrain the reply"
        raise ApiError(400, msg, param="tool_choice")
    if (forced or structured is not None) and in_reasoning:
        prefix = "\n" + THINK_END + "\n\n"
    if forced:
        # the call's start is the prompt's; its rest is the grammar's
        prefix += TOOL_START + "\n<function="
        named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        if named is not None:
            prefix += named + ">\n"
        structured = tool_call_grammar(schemas, named, req.parallel_tool_calls, tag_ids or {})
    return ChatPrompt(
        text=text + prefix,
        reply_prefix=prefix,
        in_reasoning=in_reasoning,
        parse_tools=use_tools,
        parallel_tool_calls=req.parallel_tool_calls,
        schemas=schemas,
        structured=structured,
    )


def message_ends(
    template: ChatTemplate,
    req: ChatRequest,
    prompt_ids: list[int],
    encode: Callable[[str], list[int]],
) -> list[int]:
    """Token offsets in `prompt_ids` where rendered messages end: the prompt-cache marks of a
    chat request. messages[:i+1] is rendered without the generation prompt and tokenized; its
    length counts only where its ids are a prefix of the prompt's (a template or tokenizer may
    merge across the seam: such a boundary is skipped, never passed wrong). A boundary only
    decides where a state is kept, never the reply, so one that cannot be rendered is skipped.
    """
    messages = template_messages(req.messages)
    tools = _prompt_tools(req)
    n = len(messages)
    picked = sorted({*range(min(_HEAD, n)), *range(max(0, n - _TAIL), n)})
    ends = []
    for i in picked:
        try:
            text = template.render(
                messages[: i + 1],
                tools=tools,
                add_generation_prompt=False,
                template_kwargs=req.chat_template_kwargs,
            )
            ids = encode(text)
        except Exception:  # a template that refuses a partial conversation: no mark there
            continue
        if 0 < len(ids) < len(prompt_ids) and prompt_ids[: len(ids)] == ids:
            ends.append(len(ids))
    return ends
