"""Kernel selection: one set of same-signature ops, chosen once at engine start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashlane.kernels.attention import reference as attention_ref
from flashlane.kernels.conv import reference as conv_ref
from flashlane.kernels.gdn import reference as gdn_ref
from flashlane.kernels.moe import reference as moe_ref


@dataclass(frozen=True, slots=True)
class Kernels:
    name: str
    chunk_gdn: Callable
    recurrent_gdn: Callable
    causal_conv: Callable
    select_mask: Callable
    attention: Callable
    moe: Callable


REFERENCE = Kernels(
    name="reference",
    chunk_gdn=gdn_ref.chunk_gdn,
    recurrent_gdn=gdn_ref.recurrent_gdn,
    causal_conv=conv_ref.causal_conv,
    select_mask=attention_ref.select_mask,
    attention=attention_ref.attention,
    moe=moe_ref.moe,
)


def select_kernels(device: torch.device | str) -> Kernels:
    """The kernels for a device: the pure-torch references on the CPU (and until the
    Triton kernels land, on CUDA too)."""
    return REFERENCE
