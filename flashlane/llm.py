"""LLM: the synchronous Python surface (DESIGN.md section 8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes.outputs import output
from flashlane.lanes.records import CHUNK, CostTable
from flashlane.models.flashnext import run_piece
from flashlane.models.state import SessionState
from flashlane.request import SEED_MODULUS, CompletionOutput, RequestOutput, SamplingParams
from flashlane.sampling import grammar

# text, token ids, or vLLM's {"prompt": text} / {"prompt_token_ids": ids}
Prompt = str | Sequence[int] | Mapping[str, object]
Message = Mapping[str, object]  # {"role": ..., "content": ...}


class LLM:
    """`LLM(model=None, **engine options)`; model=None is the embedded default model, a
    folder or hub id loads that checkpoint. vLLM's keywords max_model_len, max_num_seqs,
    gpu_memory_utilization, enable_prefix_caching and seed are engine options too.

    `costs` injects a fixed CostTable instead of timing one at load (tests).
    """

    def __init__(self, model: str | None = None, *, costs: CostTable | None = None, **options):
        self.config = EngineConfig.resolve(model=model, **options)
        self.engine = Engine(self.config, costs=costs)
        self._next = 0

    @classmethod
    def from_engine(cls, engine: Engine) -> LLM:
        """An LLM over an engine built elsewhere (a random checkpoint made on the GPU)."""
        llm = cls.__new__(cls)
        llm.config, llm.engine, llm._next = engine.config, engine, 0
        return llm

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        boundaries: Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """All prompts concurrently through shared rounds; outputs in the prompts' order.
        `sampling_params` (vLLM's name; `params` is ours): one for all prompts or one per
        prompt. A request with n > 1 runs n streams, choice j with seed + j, gathered in
        `RequestOutput.outputs`. `boundaries`: per prompt, token offsets where its chat
        messages end (the prompt cache keeps states there, so a conversation branching there
        resumes). `use_tqdm` is accepted for vLLM's callers and shows nothing."""
        if params is not None and sampling_params is not None:
            raise TypeError("give sampling_params or params, not both")
        given = sampling_params if sampling_params is not None else params
        batch = [prompts] if _is_single(prompts) else list(prompts)
        if given is None or isinstance(given, SamplingParams):
            plist = [given or SamplingParams()] * len(batch)
        else:
            plist = list(given)
            if len(plist) != len(batch):
                raise ValueError(f"{len(plist)} SamplingParams for {len(batch)} prompts")
        marks = list(boundaries) if boundaries is not None else [()] * len(batch)
        if len(marks) != len(batch):
            raise ValueError(f"{len(marks)} boundary lists for {len(batch)} prompts")
        host, seeds = self.engine.host, self.engine.seeds
        groups = []
        for prompt, p, b in zip(batch, plist, marks):
            if p.structured is not None:
                grammar.check(p.structured)  # a GrammarError (ValueError) before any state
            ids, seed, rids = self._ids(prompt), seeds.next(p.seed), []
            for j in range(p.n):
                rid = f"llm-{self._next}"
                self._next += 1
                host.submit(rid, ids, p, boundaries=b, seed=(seed + j) % SEED_MODULUS)
                rids.append(rid)
            groups.append((prompt, rids))
        done = self._run({r for _, rids in groups for r in rids})
        return [_gather(prompt, [done[r] for r in rids]) for prompt, rids in groups]

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        chat_template_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """vLLM's LLM.chat: one conversation (a list of {"role", "content"} dicts) or a list of
        them, rendered with the model's chat template (the engine's chat_template_kwargs under
        `chat_template_kwargs`), then generated; `text` is the raw reply."""
        from flashlane.server.chat import ChatTemplate  # jinja: only chats need it

        e = self.engine
        if e.chat_template is None or e.tokenizer is None:
            raise ValueError(f"{e.name} has no chat template and tokenizer: use generate()")
        single = len(messages) > 0 and isinstance(messages[0], Mapping)
        chats = [messages] if single else list(messages)
        eos = [e.tokenizer.id_to_token(i) for i in sorted(e.host.rules.eos_ids)[:1]]
        template = ChatTemplate(
            e.chat_template, {"eos_token": eos[0] if eos else "", "bos_token": ""}
        )
        kwargs = {**e.config.chat_template_kwargs, **(chat_template_kwargs or {})}
        prompts = [
            template.render(
                [dict(m) for m in chat],
                tools=tools,
                template_kwargs=kwargs,
                add_generation_prompt=add_generation_prompt,
            )
            for chat in chats
        ]
        return self.generate(prompts, sampling_params)

    def _run(self, rids: set[str]) -> dict[str, RequestOutput]:
        host, done = self.engine.host, {}
        while len(done) < len(rids):
            for u in host.run_once():
                if u.finish is not None:
                    done[u.stream.request_id] = output(u.stream)
            if not host.has_work and len(done) < len(rids):
                raise RuntimeError("the engine stopped with requests unfinished")
        return done

    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Teacher-forced fp32 logits [len, vocab] for every position of token_ids."""
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        if ids.numel() == 0:
            raise ValueError("token_ids is empty")
        e = self.engine
        if e.tp is not None:
            raise ValueError(
                "LLM.logits runs the model on this process alone: not with "
                f"tensor_parallel_size {e.tp.size} (use tensor_parallel_size=1)"
            )
        s = SessionState.empty(
            e.model_config,
            int(ids.numel()),
            e.sessions[0].attn_dtype(),
            e.sessions[0].state_dtype(),
            e.device,
            kv_fp8=e.sessions[0].kv_fp8,
        )
        out = [
            run_piece(e.model, s, ids[a : a + CHUNK], a, recurrent=False)
            for a in range(0, ids.numel(), CHUNK)
        ]
        return torch.cat(out).float().cpu()

    def _ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                return [int(t) for t in prompt["prompt_token_ids"]]  # type: ignore[union-attr]
            if isinstance(prompt.get("prompt"), str):
                return self.engine.encode(prompt["prompt"])  # type: ignore[arg-type]
            raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
        return self.engine.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]


def _gather(prompt: Prompt, outs: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput for the n streams of a request: choice 0's fields, all in outputs."""
    first = outs[0]
    text = prompt.get("prompt") if isinstance(prompt, Mapping) else prompt
    first.prompt = text if isinstance(text, str) else None
    first.more = [
        CompletionOutput(j, o.text, o.token_ids, o.finish_reason, o.logprobs, o.seed)
        for j, o in enumerate(outs[1:], start=1)
    ]
    return first


def _is_single(prompts) -> bool:
    return isinstance(prompts, str | Mapping) or (
        isinstance(prompts, Sequence) and len(prompts) > 0 and isinstance(prompts[0], int)
    )
