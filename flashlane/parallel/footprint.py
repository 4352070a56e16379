"""A rank's weights under tensor parallel, counted from the plan itself: the model built on
the meta device (no memory) and cut as parallel/plan.py cuts it, so the count is the one a
rank loads, replicated parts (hyper-connections, norms, router, indexer, PLE, embedding)
whole and split parts by 1/size."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashlane.models.build import build_model
from flashlane.models.config import ModelConfig
from flashlane.parallel.plan import shard_model


@dataclass(frozen=True, slots=True)
class _Shape:
    """What shard_model reads of a group, for counting: no process, no collective."""

    rank: int
    size: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        return x


def rank_params(
    cfg: ModelConfig, size: int, table: bool = True, mtp: bool = True, placed: bool = False
) -> int:
    """Parameters one rank of `size` holds: the n-gram table unless `table` is False (a GPU
    model keeps it in host memory), the MTP head unless `mtp` is False; `placed`: experts
    placed whole (expert parallel) instead of split."""
    with torch.device("meta"):
        model = build_model(cfg)
    shard_model(model, _Shape(0, size), placed)
    total = 0
    for name, p in model.named_parameters():
        if (not table and "ngram_embedding" in name) or (not mtp and name.startswith("mtp.")):
            continue
        total += p.numel()
    return total
