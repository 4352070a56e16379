"""What a request asks for and what it gets back: SamplingParams, RequestOutput, FinishReason.

Torch-free: the lane core imports this module. The sampling fields mean what DESIGN.md
section 5 says; `effective_seed` is its seed rule.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SEED_MODULUS = 2**63


class FinishReason(str, Enum):
    """Why a reply ended. A str, so it compares equal to "stop" etc. and serialises as one."""

    STOP = "stop"  # an eos id, a stop string or a stop token id
    LENGTH = "length"  # max_tokens or the session's context
    ABORT = "abort"  # the client cancelled
    ERROR = "error"  # this stream failed (RequestOutput.error says why)


def effective_seed(seed: int | None) -> int:
    """The seed the sampler uses: `seed` modulo 2**63 (negative seeds wrap), or a fresh random
    63-bit seed when None, so a reply can be reproduced from RequestOutput.seed."""
    if seed is None:
        return secrets.randbits(63)
    return seed % SEED_MODULUS


class SeedSource:
    """The seeds of requests that bring none: fresh random ones, or, with an engine seed S
    (`--seed`, `LLM(seed=S)`), S, S + 1, ... in submission order, so a run repeats."""

    def __init__(self, base: int | None = None) -> None:
        self.base = base
        self._count = 0

    def next(self, requested: int | None) -> int:
        if requested is not None or self.base is None:
            return effective_seed(requested)
        self._count += 1
        return (self.base + self._count - 1) % SEED_MODULUS


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but True as a seed or top_k is a caller's mistake.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the reply's text (vLLM's `structured_outputs`): exactly one field set.
    The mask it makes is applied to each drawing row before the keyed draw (flashlane.sampling
    .grammar), so a constrained reply is as exact as any other."""

    json: str | None = None  # a JSON schema as JSON text; '{"type": "object"}' is JSON mode
    regex: str | None = None  # the whole reply matches it
    choice: tuple[str, ...] | None = None  # the reply is one of these strings
    grammar: str | None = None  # a Lark grammar (llguidance's dialect, `%json{...}` included)

    def __post_init__(self) -> None:
        given = [v for v in (self.json, self.regex, self.choice, self.grammar) if v is not None]
        _require(len(given) == 1, "structured", "exactly one of json, regex, choice, grammar")
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            _require(value is None or isinstance(value, str), f"structured.{name}", "a str")
        ok = self.choice is None or (
            isinstance(self.choice, tuple)
            and len(self.choice) > 0
            and all(isinstance(c, str) and c for c in self.choice)
        )
        _require(ok, "structured.choice", "a non-empty tuple of non-empty str")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """One request's sampling and stopping rules (DESIGN.md section 8). Validated at creation;
    a bad value raises ValueError naming the parameter. Frozen: use dataclasses.replace."""

    max_tokens: int = 256
    temperature: float = 1.0  # below 1e-5: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    min_p: float = 0.0  # relative to the best candidate's probability
    seed: int | None = None  # None: the engine picks one and returns it
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # over the prompt and the reply
    logit_bias: dict[int, float] | None = None  # token id -> added logit
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1  # choice j uses seed + j
    logprobs: int | None = None  # how many top logprobs per token (0..20)
    draft: bool = True
    thinking_budget: int | None = None  # reasoning tokens before the think block is closed
    structured: StructuredOutput | None = None  # constrained decoding (JSON, regex, choice)

    def __post_init__(self) -> None:
        self._check_sampling()
        self._check_counts()
        self._check_lists()

    def _check_sampling(self) -> None:
        _require(_is_number(self.temperature) and self.temperature >= 0, "temperature", ">= 0")
        _require(_is_int(self.top_k) and self.top_k >= 0, "top_k", "an int >= 0")
        _require(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        _require(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        _require(
            _is_number(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            "> 0",
        )
        _require(_is_number(self.presence_penalty), "presence_penalty", "a finite number")
        _require(_is_number(self.frequency_penalty), "frequency_penalty", "a finite number")
        _require(self.seed is None or _is_int(self.seed), "seed", "an int or None")
        bias = self.logit_bias
        ok = bias is None or (
            isinstance(bias, dict)
            and all(_is_int(k) and k >= 0 and _is_number(v) for k, v in bias.items())
        )
        _require(ok, "logit_bias", "a dict of token id (int >= 0) -> finite float, or None")

    def _check_counts(self) -> None:
        _require(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an int >= 1")
        _require(_is_int(self.n) and self.n >= 1, "n", "an int >= 1")
        lp = self.logprobs
        _require(lp is None or (_is_int(lp) and 0 <= lp <= 20), "logprobs", "None or 0..20")
        tb = self.thinking_budget
        _require(tb is None or (_is_int(tb) and tb >= 0), "thinking_budget", "None or an int >= 0")
        _require(isinstance(self.ignore_eos, bool), "ignore_eos", "a bool")
        _require(isinstance(self.draft, bool), "draft", "a bool")
        st = self.structured
        _require(st is None or isinstance(st, StructuredOutput), "structured", "a StructuredOutput")
        # a finished grammar allows only the end of the reply: ignoring it would leave no token
        _require(st is None or not self.ignore_eos, "ignore_eos", "False with structured output")

    def _check_lists(self) -> None:
        stop = self.stop
        ok = stop is None or isinstance(stop, str)
        ok = ok or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
        _require(ok, "stop", "a str, a list of str, or None")
        ids = self.stop_token_ids
        ok = ids is None or (isinstance(ids, list) and all(_is_int(i) and i >= 0 for i in ids))
        _require(ok, "stop_token_ids", "a list of token ids (int >= 0) or None")


def _require(ok: bool, name: str, what: str) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{name} must be {what}")


@dataclass(slots=True)
class RequestStats:
    """How a reply was produced; the lane core fills it."""

    rounds: int = 0  # verify rounds this stream took part in
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens kept
    cached_tokens: int = 0  # prompt tokens resumed from the prompt cache
    moves: int = 0  # moves to a larger session
    pauses: int = 0  # rounds spent waiting for a session with room
    preemptions: int = 0  # times it began such a wait (vLLM's preemptions)
    queue_seconds: float = 0.0  # from submission to a session (vLLM's queue time)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One choice of a request, vLLM's `RequestOutput.outputs[i]`."""

    index: int  # the choice j (its seed is the request's + j)
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | None
    logprobs: list[dict[int, float]] | None = None
    seed: int = 0


@dataclass(slots=True)
class RequestOutput:
    """A reply, complete or (while streaming) so far; finish_reason is None until it ends.
    Its fields are choice 0's; `outputs` lists every choice, as vLLM's RequestOutput does."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    seed: int  # the seed actually used (DESIGN.md section 5): reuse it to reproduce the reply
    stats: RequestStats = field(default_factory=RequestStats)
    error: str | None = None  # set when finish_reason is "error"
    # One dict per token, id -> logprob: the top `params.logprobs` ids and the sampled one.
    logprobs: list[dict[int, float]] | None = None
    prompt: str | None = None  # the prompt text, when it was given as text
    more: list[CompletionOutput] = field(default_factory=list)  # choices 1..n-1 (n > 1)

    @property
    def outputs(self) -> list[CompletionOutput]:
        first = CompletionOutput(
            0, self.text, self.token_ids, self.finish_reason, self.logprobs, self.seed
        )
        return [first, *self.more]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    stop_string: str | None = None  # the stop string that ended the reply, if one did
