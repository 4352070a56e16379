"""A fake engine for the server tests: deterministic replies over a small byte-level BPE.

Replies are either scripted (a trigger string in the prompt picks the reply text) or drawn
from a word list by a PRNG keyed on (seed, prompt), so a seed reproduces its reply and
temperature 0 always gives the same one. Text goes through the same IncrementalDetokenizer and
StopMatcher the engine host uses.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from flashlane.detok import IncrementalDetokenizer, StopMatcher
from flashlane.request import FinishReason, RequestOutput, RequestStats, SamplingParams
from flashlane.server.engine_api import QueueFull

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Weather in Paris is mild in spring; the rain falls softly on the river and the bridges.",
    "A server streams tokens to its clients, one chunk at a time, until the reply is done.",
    "Let me think about the question before I answer it: two plus two is four.",
    "Functions take parameters and return values; a tool call names a function and its args.",
    "The answer is simple, and the reasoning behind it is short, clear and easy to check.",
    "Numbers like 1, 2, 3, 42 and 3.14 appear in text, along with words such as hello and world.",
]

WORDS = [
    "the",
    "quick",
    "fox",
    "river",
    "server",
    "token",
    "answer",
    "rain",
    "sun",
    "clear",
    "hello",
    "world",
    "two",
    "four",
    "reply",
    "stream",
    "bridge",
    "cat",
    "dog",
    "spring",
]

# A Qwen3.5-style ChatML template: thinking opened in the prompt, Qwen3-Coder XML tool calls.
TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>
<function={{ call.function.name }}>
{%- for name, value in call.function.arguments.items() %}
<parameter={{ name }}>
{{ value if value is string else value | tojson }}
</parameter>
{%- endfor %}
</function>
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}
{%- endif %}"""


def build_tokenizer() -> Tokenizer:
    """A byte-level BPE of ~400 ids trained on CORPUS, with Qwen's special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 3, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return tok


@dataclass
class FakeEngine:
    tokenizer: Tokenizer = field(default_factory=build_tokenizer)
    model_name: str = "fake-flash"
    context_len: int = 1024
    generation_defaults: dict = field(default_factory=lambda: {"temperature": 0.7, "top_k": 20})
    chat_template: str | None = TEMPLATE
    max_queue: int = 64
    delay: float = 0.0  # seconds between snapshots
    scripts: dict[str, str] = field(default_factory=dict)  # prompt trigger -> reply text

    def __post_init__(self) -> None:
        self.eos_token_ids = [self.tokenizer.token_to_id("<|im_end|>")]
        self.live: set[str] = set()
        self.aborted: list[str] = []
        self.started: list[tuple[str, list[int], SamplingParams]] = []
        self.boundaries: dict[str, list[int]] = {}  # request id -> the marks it was given
        self.num_tokens = 0

    def reset(self) -> None:
        """Forgets scripts and what it was asked (tests share one engine per module)."""
        self.scripts.clear()
        self.__post_init__()

    def stats(self) -> dict[str, float]:
        return {
            "sessions_busy": len(self.live),
            "sessions_total": 4,
            "queue": 0,
            "drafted": 2 * self.num_tokens,
            "accepted": self.num_tokens,
        }

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def prompt_logprobs(self, ids: list[int], top: int) -> list[dict[int, float] | None]:
        return [None] + [_logprobs(t, top, i) for i, t in enumerate(ids[1:])]

    def reply_ids(self, prompt_ids: list[int], params: SamplingParams) -> list[int]:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        for trigger, text in self.scripts.items():
            if trigger in prompt:
                ids = self.tokenizer.encode(text, add_special_tokens=False).ids
                return ids + self.eos_token_ids
        seed = 0 if params.temperature < 1e-5 else params.seed
        key = hashlib.sha256(repr((seed, prompt_ids)).encode()).digest()
        rng = random.Random(key)
        text = " ".join(rng.choice(WORDS) for _ in range(params.max_tokens))
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    async def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        boundaries: Sequence[int] = (),
    ) -> AsyncIterator[RequestOutput]:
        if len(self.live) >= self.max_queue:
            raise QueueFull(request_id)
        if any(not 0 < b <= len(prompt_ids) for b in boundaries):
            raise ValueError(f"boundaries {list(boundaries)} outside the prompt")
        self.live.add(request_id)
        self.started.append((request_id, prompt_ids, params))
        self.boundaries[request_id] = list(boundaries)
        try:
            async for out in self._run(prompt_ids, params, request_id):
                if out.finish_reason is not None:
                    # like the real engine: a reply that has ended no longer holds a session,
                    # whenever the server gets round to closing this generator
                    self.live.discard(request_id)
                yield out
        finally:
            self.live.discard(request_id)

    async def _run(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        detok = IncrementalDetokenizer(self.tokenizer)
        stops = StopMatcher(params.stop)
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= set(self.eos_token_ids)
        out = RequestOutput(
            request_id,
            prompt_ids,
            [],
            "",
            None,
            params.seed or 0,
            RequestStats(cached_tokens=len(prompt_ids) // 2),
        )
        out.logprobs = [] if params.logprobs is not None else None
        for token in self.reply_ids(prompt_ids, params):
            await asyncio.sleep(self.delay)
            if request_id in self.aborted:
                out.finish_reason = FinishReason.ABORT
                break
            self.num_tokens += 1
            out.token_ids.append(token)
            if out.logprobs is not None:
                out.logprobs.append(_logprobs(token, params.logprobs or 0, len(out.token_ids)))
            if token in stop_ids:
                out.finish_reason = FinishReason.STOP
                break
            detok.add([token])
            check = stops.check(detok.text)
            out.text = detok.text[: check.visible] if check.stop else detok.text
            if check.stop:
                out.finish_reason = FinishReason.STOP
                break
            if len(out.token_ids) >= params.max_tokens:
                out.text += detok.flush()
                out.finish_reason = FinishReason.LENGTH
                break
            yield _copy(out)
        if out.finish_reason is None:  # a script ran out (ignore_eos)
            out.text += detok.flush()
            out.finish_reason = FinishReason.LENGTH
        yield _copy(out)


def _logprobs(token: int, top: int, position: int) -> dict[int, float]:
    """Made-up but deterministic: the token and `top` neighbours, descending."""
    entry = {token: -0.25 - 0.01 * (position % 7)}
    for k in range(top):
        entry.setdefault(100 + k, -1.0 - k)
    return entry


def _copy(out: RequestOutput) -> RequestOutput:
    return RequestOutput(
        out.request_id,
        out.prompt_token_ids,
        list(out.token_ids),
        out.text,
        out.finish_reason,
        out.seed,
        out.stats,
        logprobs=None if out.logprobs is None else list(out.logprobs),
    )
