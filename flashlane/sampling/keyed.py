"""Keyed randomness (DESIGN.md section 5): a uniform per (seed, position, token), never a stream.

The scalar functions are the readable spec; the numpy and torch versions compute the same bits
for many tokens at once. The first two splitmix64 rounds depend only on (seed, position), so the
vectorised forms take that `row_key` and hash only `row_key ^ token` per token.
"""

from __future__ import annotations

import math

import numpy as np
import torch

MASK64 = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
# u = ((h >> 12) + 0.5) * 2**-52 lies in [2**-53, 1 - 2**-53].
U_MIN = 2.0**-53
U_MAX = 1.0 - 2.0**-53


def splitmix64(x: int) -> int:
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * MIX1) & MASK64
    x = ((x ^ (x >> 27)) * MIX2) & MASK64
    return x ^ (x >> 31)


def row_key(seed: int, position: int) -> int:
    """The part of the hash shared by every token of one draw."""
    return splitmix64(splitmix64(seed & MASK64) ^ position)


def uniform(seed: int, position: int, token: int) -> float:
    """Strictly inside (0, 1), so the Gumbel noise is always finite."""
    h = splitmix64(row_key(seed, position) ^ token)
    return ((h >> 12) + 0.5) * 2.0**-52


def gumbel(u: float) -> float:
    return -math.log(-math.log(u))


# The largest noise any token can get; a candidate whose z plus this cannot beat a score
# already found cannot win (the pruning bound of choose.py and gpu.py).
GUMBEL_MAX = gumbel(U_MAX)
GUMBEL_MIN = gumbel(U_MIN)


def splitmix64_np(x: np.ndarray) -> np.ndarray:
    """splitmix64 over a uint64 array; numpy uint64 arrays wrap modulo 2**64 as we need."""
    x = x + np.uint64(GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(MIX1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(MIX2)
    return x ^ (x >> np.uint64(31))


def uniforms_np(key: int, token_ids: np.ndarray) -> np.ndarray:
    """uniform(seed, position, t) for each t in `token_ids` [n], given row_key(seed, position).
    Returns float64 [n]."""
    h = splitmix64_np(np.uint64(key) ^ token_ids.astype(np.uint64))
    return ((h >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52


def gumbel_np(u: np.ndarray) -> np.ndarray:
    return -np.log(-np.log(u))


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - 2**64 if c >= 2**63 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    # torch's >> on int64 is arithmetic; clearing the top s bits makes it logical.
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64_torch(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 over an int64 tensor holding the bits of uint64 values, on any device;
    int64 addition and multiplication wrap modulo 2**64 like the uint64 arithmetic."""
    x = x + _signed(GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(MIX1)
    x = (x ^ _shr(x, 27)) * _signed(MIX2)
    return x ^ _shr(x, 31)


def row_keys_torch(keys: list[int], device: torch.device | str) -> torch.Tensor:
    """row_key values (uint64 as Python ints) -> int64 tensor [n] with the same bits."""
    return torch.tensor([_signed(k) for k in keys], dtype=torch.int64, device=device)


def uniforms_torch(keys: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """uniform for int64 `keys` and `token_ids` of broadcastable shapes (e.g. [N, 1] and [N, P]);
    returns float64 of the broadcast shape."""
    h = splitmix64_torch(keys ^ token_ids)
    return (_shr(h, 12).to(torch.float64) + 0.5) * 2.0**-52


def gumbel_torch(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))
