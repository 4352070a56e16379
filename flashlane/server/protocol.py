"""OpenAI request bodies for /v1/chat/completions and /v1/completions, and the error shape.

Unknown fields are ignored (clients send extras); known fields are strict: a wrong type or a
value out of range is a 400 naming the field. Sampling fields left out stay None here and are
filled from the checkpoint's generation_config.json by `generate.sampling_params`.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """An error the client sees, in the OpenAI shape {"error": {message, type, param, code}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers or {}  # e.g. Retry-After on a 429
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class Strict(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class FunctionDef(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"] = "function"
    function: FunctionName


class ToolCallFunction(Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(Strict):
    # image and audio parts are refused where messages are rendered, naming the part
    type: str
    text: str | None = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class SamplingFields(Strict):
    """Fields both endpoints share; None means "not sent"."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # -1 (vLLM's spelling) and 0 both mean no top-k filter
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    # 63 bits, as the sampler keys them: a larger or negative seed is refused, not wrapped
    seed: int | None = Field(None, ge=0, lt=2**63)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # beyond these a seen token's logit is scaled by over 100x, and a tiny one overflows
    repetition_penalty: float | None = Field(None, ge=0.01, le=100.0)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    draft: bool = True
    thinking_budget: int | None = Field(None, ge=0)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # structured output (server/structured.py reads and checks them; at most one is set)
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_shared(self) -> SamplingFields:
        if self.n > 128:
            raise ApiError(400, "n must be at most 128", param="n")
        for key, bias in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise ApiError(400, f"logit_bias key {key!r} is not a token id", param="logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise ApiError(400, "logit_bias values must lie in [-100, 100]", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            msg = "stream_options is only allowed with stream: true"
            raise ApiError(400, msg, param="stream_options")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatRequest:
        if self.max_tokens == 0:
            raise ApiError(400, "max_tokens must be at least 1", param="max_tokens")
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or ()]
            if self.tool_choice.function.name not in names:
                msg = f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools"
                raise ApiError(400, msg, param="tool_choice")
        if self.tool_choice == "required" and not self.tools:
            raise ApiError(400, "tool_choice 'required' needs tools", param="tool_choice")
        return self

    @property
    def reply_limit(self) -> int | None:
        """max_completion_tokens wins over the older max_tokens."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's default for completions; 0 with echo returns only the prompt's logprobs
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    # vLLM's: each choice also carries its reply's token ids (streamed: each chunk's) and,
    # once, its prompt's; text alone loses ids the tokenizer does not decode
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of > 1:
            raise ApiError(400, "best_of > 1 is not supported", param="best_of")
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens 0 needs echo", param="max_tokens")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts as a batch: text or token ids each."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    content: str | None = None  # llama.cpp's name for prompt
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        given = [x for x in (self.prompt, self.content, self.messages) if x is not None]
        if len(given) != 1:
            msg = "send exactly one of prompt (or llama.cpp's content) and messages"
            raise ApiError(400, msg, param="prompt")
        return self

    @property
    def text(self) -> str | None:
        return self.prompt if self.prompt is not None else self.content


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


def parse_request(model: type[M], data: Any) -> M:
    """Validates a decoded JSON body; wrong types and ranges become a 400 naming the field."""
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        param = param_path(err["loc"])
        raise ApiError(400, f"{param or 'body'}: {err['msg']}", param=param) from None


def param_path(loc: tuple[int | str, ...]) -> str | None:
    """('messages', 0, 'content', 'str') -> 'messages[0].content' (union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier() and part.islower() and part not in _TYPE_TAGS:
            out += f".{part}" if out else part
    return out or None


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list"}
