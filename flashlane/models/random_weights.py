"""Size-faithful random checkpoints built directly on the device (no download, no disk).

Every tensor comes from its own generator, seeded by (seed, name), so a second model (the
transformers peer of a benchmark) can be filled with the same values after ours is freed:
two copies of a 70 GB model do not fit one GPU. Scales follow the training init: linears and
embeddings N(0, 0.02), zero-centred norms at identity, GDN decays A in [1, 16], dt_bias 1.
"""

from __future__ import annotations

import zlib

import torch

from flashlane.models.build import build_model
from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext


def _generator(seed: int, name: str, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def random_tensor(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device, seed: int = 0
) -> torch.Tensor:
    """The value of parameter `name` (our names) in the random checkpoint of `seed`."""
    device = torch.device(device)
    gen = _generator(seed, name, device)
    if name.endswith("A_log"):
        x = torch.empty(shape, device=device).uniform_(1, 16, generator=gen).log()
    elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        x = torch.ones(shape, device=device)
    elif len(shape) == 1:
        x = torch.zeros(shape, device=device)
    else:
        std = (1 / shape[-1]) ** 0.5 if name.endswith("conv1d.weight") else 0.02
        x = torch.randn(shape, generator=gen, device=device) * std
    return x.to(dtype)


def build_random(
    raw: dict, dtype: torch.dtype, device, seed: int = 0
) -> tuple[ModelConfig, FlashNext]:
    """The model of config dict `raw` (any family) with random weights, made on `device`
    tensor by tensor."""
    cfg = ModelConfig.from_hf(raw)
    with torch.device("meta"):
        model = build_model(cfg)
    buffers = dict(model.named_buffers())  # the PLE's hash constants: computed, not drawn
    state = {
        name: buffers[name].to(device)
        if name in buffers
        else random_tensor(name, tuple(meta.shape), dtype, device, seed)
        for name, meta in model.state_dict().items()
    }
    model.load_state_dict(state, assign=True, strict=True)
    model.rotary = type(model.rotary)(cfg.rotary_dim, cfg.rope_theta)
    return cfg, model.eval().requires_grad_(False)


def fill_transformers(model: torch.nn.Module, seed: int = 0) -> None:
    """Give a transformers Qwen4Exp (or sibling) model the values of `build_random(..., seed)`.

    Its names are ours with a `model.` prefix, except the fused `experts.gate_up_proj`
    (our gate_proj and up_proj stacked along the output dim) and Qwen3-Next's fused GDN
    projections (ours interleaved per key head: loader.split_fused_gdn's inverse).
    """
    with torch.no_grad():
        for hf_name, p in model.named_parameters():
            name = hf_name.removeprefix("model.")
            if name.endswith(("in_proj_qkvz.weight", "in_proj_ba.weight")):
                p.copy_(_fused_gdn(model.config, name, p, seed))
            elif name.endswith("experts.gate_up_proj"):
                half = p.shape[1] // 2
                base = name.removesuffix("gate_up_proj")
                shape = (p.shape[0], half, p.shape[2])
                p[:, :half].copy_(random_tensor(base + "gate_proj", shape, p.dtype, p.device, seed))
                p[:, half:].copy_(random_tensor(base + "up_proj", shape, p.dtype, p.device, seed))
            else:
                p.copy_(random_tensor(name, tuple(p.shape), p.dtype, p.device, seed))


def _fused_gdn(c, name: str, p: torch.Tensor, seed: int) -> torch.Tensor:
    """Qwen3-Next's in_proj_qkvz or in_proj_ba from our random projections: per key head,
    its q, k, v and z rows (or b and a rows) side by side."""
    nk, dk, dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim
    nv, h = c.linear_num_value_heads, p.shape[1]

    def ours(part: str, rows: int) -> torch.Tensor:
        base = name.rsplit(".", 2)[0]
        return random_tensor(f"{base}.in_proj_{part}.weight", (rows, h), p.dtype, p.device, seed)

    if name.endswith("in_proj_qkvz.weight"):
        parts = [
            *ours("qkv", 2 * nk * dk + nv * dv).split([nk * dk, nk * dk, nv * dv]),
            ours("z", nv * dv),
        ]
    else:
        parts = [ours("b", nv), ours("a", nv)]
    return torch.cat([t.unflatten(0, (nk, -1)) for t in parts], dim=1).flatten(0, 1)
