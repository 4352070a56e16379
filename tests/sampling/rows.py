"""Random rows and draw specs for the sampler tests: spreads from flat to peaked, ties, -inf
ids, penalties, and every filter at and around its edges."""

from __future__ import annotations

import numpy as np
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec

SCALES = (0.1, 1.0, 3.0, 10.0, 50.0)


def random_row(rng: np.random.Generator, vocab: int) -> torch.Tensor:
    """fp32 logits [vocab] with a random spread, sometimes ties, -inf ids or a few peaked ids."""
    logits = rng.normal(size=vocab) * rng.choice(SCALES)
    if rng.random() < 0.3:
        logits = np.round(logits)
    if rng.random() < 0.3:
        logits[rng.integers(0, vocab, 8)] += rng.uniform(5, 20, 8)
    if rng.random() < 0.2:
        logits[rng.random(vocab) < 0.4] = -np.inf
    return torch.from_numpy(logits.astype(np.float32))


def random_rows(gen: torch.Generator, num_rows: int, vocab: int) -> torch.Tensor:
    """The same mix as random_row for a [num_rows, vocab] batch, made on gen's device."""
    dev = gen.device

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, device=dev)

    scales = torch.tensor(SCALES, device=dev)[(uniform(num_rows) * len(SCALES)).long()]
    logits = torch.randn(num_rows, vocab, generator=gen, device=dev) * scales[:, None]
    logits = torch.where(uniform(num_rows, 1) < 0.3, logits.round(), logits)
    peaked = (uniform(num_rows, 1) < 0.3) & (uniform(num_rows, vocab) < 8 / vocab)
    logits = logits + peaked * (5 + 15 * uniform(num_rows, vocab))
    masked = (uniform(num_rows, 1) < 0.2) & (uniform(num_rows, vocab) < 0.4)
    return logits.masked_fill(masked, -torch.inf).float()


def random_spec(rng: np.random.Generator, vocab: int) -> DrawSpec:
    params: dict = dict(
        temperature=float(rng.choice([0.0, 1e-6, 1e-5, 0.3, 0.7, 1.0, 1.5, 3.0])),
        top_k=int(rng.choice([0, 0, 1, 2, 5, 20, vocab, vocab + 5])),
        top_p=float(rng.choice([1.0, 1.0, 0.999, 0.95, 0.8, 0.5, 0.1, 1e-9])),
        min_p=float(rng.choice([0.0, 0.0, 0.01, 0.05, 0.3, 1.0])),
    )
    if rng.random() < 0.2:
        params.update(
            repetition_penalty=float(rng.choice([0.5, 1.3, 2.0])),
            presence_penalty=float(rng.choice([0.0, 0.5, -1.0])),
            frequency_penalty=float(rng.choice([0.0, 0.3])),
            logit_bias={int(k): float(rng.normal() * 3) for k in rng.integers(0, vocab, 3)},
        )
    prompt_ids, reply_ids = rng.integers(0, vocab, 5).tolist(), rng.integers(0, vocab, 6).tolist()
    seed, position = int(rng.integers(0, 2**63)), int(rng.integers(0, 300_000))
    return DrawSpec(SamplingParams(**params), seed, position, prompt_ids, reply_ids)
