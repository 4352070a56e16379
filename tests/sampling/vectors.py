"""Loads tests/data/keyed_sampler.json (DESIGN.md section 5's reference values)."""

from __future__ import annotations

import base64
import functools
import json
from typing import Any

import numpy as np
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec
from tests import DATA

PATH = DATA / "keyed_sampler.json"
PARAM_KEYS = (
    "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty",
)  # fmt: skip


@functools.cache
def load() -> dict[str, Any]:
    return json.loads(PATH.read_text())


def logits_of(entry: dict[str, Any]) -> torch.Tensor:
    """A draw entry's fp32 logits [V]: a list (with 'nan'/'inf'/'-inf' strings) or, for wide
    rows, little-endian float32 in base64."""
    if "logits_f32_le_base64" in entry:
        raw = np.frombuffer(base64.b64decode(entry["logits_f32_le_base64"]), dtype="<f4")
        assert raw.size == entry["vocab"]
        return torch.from_numpy(raw.astype(np.float32))
    return torch.tensor([float(x) for x in entry["logits"]], dtype=torch.float32)


def spec_of(entry: dict[str, Any]) -> DrawSpec:
    kwargs: dict[str, Any] = {k: entry[k] for k in PARAM_KEYS if k in entry}
    if "logit_bias" in entry:
        kwargs["logit_bias"] = {int(k): float(v) for k, v in entry["logit_bias"].items()}
    return DrawSpec(
        SamplingParams(**kwargs),
        entry["seed"],
        entry["position"],
        entry.get("prompt_ids", ()),
        entry.get("reply_ids", ()),
    )
