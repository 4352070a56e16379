"""LLM: the synchronous Python surface (DESIGN.md section 8)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes.outputs import output
from flashlane.lanes.records import CHUNK, CostTable
from flashlane.models.flashnext import run_piece
from flashlane.models.state import SessionState
from flashlane.request import RequestOutput, SamplingParams
from flashlane.sampling import grammar

Prompt = str | Sequence[int]


class LLM:
    """`LLM(model=None, **engine options)`; model=None is the embedded default model.

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
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        boundaries: Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """All prompts concurrently through shared rounds; outputs in the prompts' order.
        `boundaries`: per prompt, token offsets where its chat messages end (the prompt cache
        keeps states there, so a conversation branching there resumes)."""
        batch = [prompts] if _is_single(prompts) else list(prompts)
        if params is None or isinstance(params, SamplingParams):
            plist = [params or SamplingParams()] * len(batch)
        else:
            plist = list(params)
            if len(plist) != len(batch):
                raise ValueError(f"{len(plist)} SamplingParams for {len(batch)} prompts")
        marks = list(boundaries) if boundaries is not None else [()] * len(batch)
        if len(marks) != len(batch):
            raise ValueError(f"{len(marks)} boundary lists for {len(batch)} prompts")
        host = self.engine.host
        ids = []
        for prompt, p, b in zip(batch, plist, marks):
            if p.n != 1:
                raise ValueError("n > 1 is not supported by LLM.generate yet; send copies")
            if p.structured is not None:
                grammar.check(p.structured)  # a GrammarError (ValueError) before any state
            rid = f"llm-{self._next}"
            self._next += 1
            host.submit(rid, self._ids(prompt), p, boundaries=b)
            ids.append(rid)
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for u in host.run_once():
                if u.finish is not None:
                    done[u.stream.request_id] = output(u.stream)
            if not host.has_work and len(done) < len(ids):
                raise RuntimeError("the engine stopped with requests unfinished")
        return [done[r] for r in ids]

    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Teacher-forced fp32 logits [len, vocab] for every position of token_ids."""
        ids = torch.tensor(list(token_ids), dtype=torch.long)
        if ids.numel() == 0:
            raise ValueError("token_ids is empty")
        e = self.engine
        s = SessionState.empty(
            e.model_config,
            int(ids.numel()),
            e.sessions[0].attn_dtype(),
            e.sessions[0].state_dtype(),
            e.device,
        )
        out = [
            run_piece(e.model, s, ids[a : a + CHUNK], a, recurrent=False)
            for a in range(0, ids.numel(), CHUNK)
        ]
        return torch.cat(out).float().cpu()

    def _ids(self, prompt: Prompt) -> list[int]:
        return self.engine.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]


def _is_single(prompts) -> bool:
    return isinstance(prompts, str) or (
        isinstance(prompts, Sequence) and len(prompts) > 0 and isinstance(prompts[0], int)
    )
