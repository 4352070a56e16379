"""Block FP8 weights, as the published FP8 checkpoints of this family (and DeepSeek-V3) store
them: a linear weight `W` [N, K] becomes e4m3 values `Q` [N, K] (torch.float8_e4m3fn) and a
float32 `<name>_scale_inv` [ceil(N/BN), ceil(K/BK)], one per BN x BK block (the edge blocks
may be partial). Reference semantics, per block b:

    scale_inv[b] = amax(|W[b]|) / 448      (448: e4m3's largest finite value; 1 for a zero block)
    Q[b]         = e4m3(clamp(W[b] / scale_inv[b], -448, 448))   (round to nearest even)
    W'[b]        = Q[b] * scale_inv[b]      (dequantized: the FP8 model's real value)

Dequantization multiplies in float64, where an e4m3 value (4 significant bits) times a float32
scale (24) is exact, then casts once to the model's dtype. config.json's
`quantization_config` says which method and block size; which tensors are quantized is read
from the checkpoint itself (a tensor with a `_scale_inv` sibling), as transformers 5.17 does.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_DTYPE = torch.float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"
# What `--quantization fp8` (and the tests' FP8 checkpoints) leave in the checkpoint's dtype,
# as the published FP8 checkpoints do: embeddings, the n-gram table, lm_head, the router and
# shared-expert gates, the hyper-connection mixers and the GDN's per-head a/b projections
# (tiny, and they set decays and gates). Matched as transformers matches
# modules_to_not_convert; norms, biases and convs are never quantized (not 2-D linears).
DEFAULT_NOT_CONVERTED = (
    "lm_head",
    "embed_tokens",
    ".*ngram_embedding",
    "mlp.gate",
    "mlp.shared_expert_gate",
    ".*hyper_connection",
    "linear_attn.in_proj_a",
    "linear_attn.in_proj_b",
)


class QuantizationError(ValueError):
    """A quantization_config or a quantized tensor that flashlane cannot read."""


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """A checkpoint's `quantization_config` (only block FP8 is known)."""

    block: tuple[int, int] = (128, 128)  # weight_block_size: rows, columns of one scale
    # module-name patterns left unquantized (transformers' matching, see is_converted)
    not_converted: tuple[str, ...] = DEFAULT_NOT_CONVERTED

    @classmethod
    def from_config(cls, raw: object, where: str = "config.json") -> QuantSpec:
        """Read quantization_config; an unknown method, format or scale dtype is an error."""
        if not isinstance(raw, dict):
            raise QuantizationError(f"{where}: quantization_config must be an object")
        method = raw.get("quant_method")
        if method != "fp8":
            raise QuantizationError(
                f"{where}: quantization_config.quant_method {method!r} is "
                "not supported (only 'fp8', block FP8)"
            )
        if raw.get("fmt", "e4m3") != "e4m3":
            raise QuantizationError(
                f"{where}: quantization_config.fmt {raw['fmt']!r}: only 'e4m3' is supported"
            )
        if raw.get("activation_scheme", "dynamic") != "dynamic":
            raise QuantizationError(
                f"{where}: quantization_config.activation_scheme "
                f"{raw['activation_scheme']!r}: only 'dynamic' is supported"
            )
        if raw.get("scale_fmt", "float") != "float":
            raise QuantizationError(
                f"{where}: quantization_config.scale_fmt "
                f"{raw['scale_fmt']!r}: only float32 scales are supported"
            )
        block = raw.get("weight_block_size", [128, 128])
        if (
            not isinstance(block, list | tuple)
            or len(block) != 2
            or not all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise QuantizationError(
                f"{where}: quantization_config.weight_block_size must be "
                f"two positive ints, got {block!r}"
            )
        skip = raw.get("modules_to_not_convert", raw.get("ignored_layers")) or []
        return cls(block=(block[0], block[1]), not_converted=tuple(skip))

    def to_config(self) -> dict:
        """The quantization_config a checkpoint quantized with this spec carries."""
        return {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(self.block),
            "modules_to_not_convert": list(self.not_converted),
        }

    def is_converted(self, name: str) -> bool:
        """Whether `--quantization fp8` quantizes checkpoint tensor `name` (a 2-D `.weight`):
        its module (the name less `.weight`) matches no pattern as transformers 5.17's
        should_convert_module matches: `pattern.` or `pattern` at the start (a regex), or
        the name ending with the pattern."""
        if not name.endswith(".weight"):
            return False
        module = name.removesuffix(".weight")
        return not any(
            re.match(f"{p}\\.", module) or re.match(p, module) or module.endswith(p)
            for p in self.not_converted
        )


def read_quant_spec(config_path: Path) -> QuantSpec | None:
    """The QuantSpec of a config.json (a file or its folder), None without quantization_config."""
    path = config_path / "config.json" if config_path.is_dir() else config_path
    raw = json.loads(path.read_text()).get("quantization_config")
    return None if raw is None else QuantSpec.from_config(raw, str(path))


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight of `shape` [..., N, K]: [..., ceil(N/BN), ceil(K/BK)]."""
    *lead, n, k = shape
    return (*lead, math.ceil(n / block[0]), math.ceil(k / block[1]))


def _expand(scale_inv: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    full = scale_inv.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., : shape[-2], : shape[-1]]


def quantize_blocks(
    w: torch.Tensor, block: tuple[int, int] = (128, 128)
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., N, K] (any float dtype) -> (e4m3 [..., N, K], float32 scale_inv
    [..., ceil(N/BN), ceil(K/BK)]), the module docstring's semantics."""
    if w.ndim < 2 or not w.is_floating_point():
        raise QuantizationError(
            f"quantize_blocks needs a float tensor of 2+ dims, got {w.dtype} {tuple(w.shape)}"
        )
    x = w.to(torch.float32)
    *lead, n, k = x.shape
    gn, gk = scale_shape(tuple(x.shape), block)[-2:]
    padded = torch.zeros(*lead, gn * block[0], gk * block[1], dtype=torch.float32, device=x.device)
    padded[..., :n, :k] = x  # zero padding leaves each partial block's amax alone
    amax = padded.unflatten(-1, (gk, block[1])).unflatten(-3, (gn, block[0])).abs().amax((-3, -1))
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (x / _expand(scale_inv, x.shape, block)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale_inv


def dequantize_blocks(
    q: torch.Tensor,
    scale_inv: torch.Tensor,
    dtype: torch.dtype,
    block: tuple[int, int] = (128, 128),
) -> torch.Tensor:
    """q [..., N, K] float8_e4m3fn, scale_inv [..., ceil(N/BN), ceil(K/BK)] float32 ->
    q * scale_inv per block, computed in float64 (exact) and cast once to dtype."""
    if q.dtype != FP8_DTYPE:
        raise QuantizationError(f"expected float8_e4m3fn values, got {q.dtype}")
    want = scale_shape(tuple(q.shape), block)
    if tuple(scale_inv.shape) != want:
        raise QuantizationError(
            f"scale shape {tuple(scale_inv.shape)} does not fit the weight "
            f"{tuple(q.shape)} in {block[0]}x{block[1]} blocks: expected "
            f"{want}"
        )
    if not scale_inv.is_floating_point():
        raise QuantizationError(f"scale dtype {scale_inv.dtype} is not a float")
    s = _expand(scale_inv.to(torch.float64), q.shape, block)
    return (q.to(torch.float64) * s).to(dtype)


def quantize_state(tensors: dict[str, torch.Tensor], spec: QuantSpec) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (HF names) with every 2-D float linear weight spec converts replaced
    by its e4m3 values plus `<name>_scale_inv`; the rest unchanged."""
    out = {}
    for name, t in tensors.items():
        if t.ndim == 2 and t.is_floating_point() and spec.is_converted(name):
            out[name], out[name + SCALE_SUFFIX] = quantize_blocks(t, spec.block)
        else:
            out[name] = t
    return out


def dequantize_state(
    tensors: dict[str, torch.Tensor],
    spec: QuantSpec | None,
    dtype: torch.dtype,
    keep: Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """Checkpoint tensors with each e4m3 tensor and its `_scale_inv` folded into one tensor of
    dtype, except those `keep(name)` keeps as they are (e4m3 values and float32 scales, the
    grid checked). An e4m3 tensor without scale, a scale without its tensor, or e4m3 tensors
    without a quantization_config are errors (QuantizationError naming the tensor)."""
    scales = {n.removesuffix(SCALE_SUFFIX) for n in tensors if n.endswith(SCALE_SUFFIX)}
    out = {}
    for name, t in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            if name.removesuffix(SCALE_SUFFIX) not in tensors:
                raise QuantizationError(
                    f"scale {name!r} has no tensor {name.removesuffix(SCALE_SUFFIX)!r}"
                )
            continue
        if t.dtype != FP8_DTYPE and name not in scales:
            out[name] = t
            continue
        if spec is None:
            raise QuantizationError(
                f"tensor {name!r} is quantized ({t.dtype}, or has a scale) "
                "but config.json has no quantization_config"
            )
        if name not in scales:
            raise QuantizationError(
                f"tensor {name!r} is float8_e4m3fn without {name}{SCALE_SUFFIX}"
            )
        try:
            if keep is not None and keep(name):
                out[name], out[name + SCALE_SUFFIX] = _checked(t, tensors[name + SCALE_SUFFIX])
                continue
            out[name] = dequantize_blocks(t, tensors[name + SCALE_SUFFIX], dtype, spec.block)
        except QuantizationError as err:
            raise QuantizationError(f"tensor {name!r}: {err}") from None
    return out


def _checked(q: torch.Tensor, scale_inv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 tensor and its scales kept as FP8: the dtypes and the 128 x 128 grid checked."""
    if q.dtype != FP8_DTYPE:
        raise QuantizationError(f"expected float8_e4m3fn values, got {q.dtype}")
    want = scale_shape(tuple(q.shape), (128, 128))
    if tuple(scale_inv.shape) != want:
        raise QuantizationError(
            f"scale shape {tuple(scale_inv.shape)} does not fit the weight {tuple(q.shape)} "
            f"in 128x128 blocks: expected {want}"
        )
    return q, scale_inv.to(torch.float32)
