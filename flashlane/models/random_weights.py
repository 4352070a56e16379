"""Size-faithful random checkpoints built directly on the device (no download, no disk).

Every tensor comes from its own generator, seeded by (seed, name), so a second model (the
transformers peer of a benchmark) can be filled with the same values after ours is freed:
two copies of a 70 GB model do not fit one GPU. Scales follow the training init: linears and
embeddings N(0, 0.02), zero-centred norms at identity, GDN decays A in [1, 16], dt_bias 1.

`quantize="fp8"` builds the linears and expert stacks `--quantization fp8` converts straight
into block FP8 (Fp8Weight: the fp32 draw quantized tensor by tensor, a few experts at a time,
on the device): no bf16 copy of the model is ever made, so the full Flash Next's FP8 text
model is built on one H200. `ple_tables="host"` puts the n-gram tables in pinned host memory,
drawn on the device a slice of rows at a time; with `table_dtype="int8"` each slice is drawn
in the compute dtype and quantized to 8 bits there (table8.quantize_rows, a row at a time):
the same pair as quantizing the bf16 table of the same seed, no bf16 table ever whole.
"""

from __future__ import annotations

import zlib

import torch

from flashlane.models import host_tables
from flashlane.models.build import build_model
from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.fp8 import QuantSpec, quantize_blocks
from flashlane.models.fp8_weights import (
    WeightFormat,
    dequantize_modules,
    install_empty_fp8,
    weight_format,
)
from flashlane.models.host_tables import TablePlace, is_table, mark_tables, pinned, table_place
from flashlane.models.segments import expandable_segments
from flashlane.models.table8 import TableDtype, quantize_rows

# experts quantized at once (of an fp32 draw of the whole stack): bounds the transients
_EXPERTS_AT_ONCE = 16
# table rows drawn on the device at once, for a table in host memory
_TABLE_ROWS_AT_ONCE = 1 << 20


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
    raw: dict, dtype: torch.dtype, device, *args, **kw
) -> tuple[ModelConfig, FlashNext]:
    """_build (below) with the weights in expandable segments on CUDA (models/segments.py)."""
    with expandable_segments(device):
        return _build(raw, dtype, device, *args, **kw)


def _build(
    raw: dict,
    dtype: torch.dtype,
    device,
    seed: int = 0,
    quantize: str | None = None,
    ple_tables: TablePlace = "device",
    weights: WeightFormat | None = None,
    table_dtype: TableDtype = "bf16",
) -> tuple[ModelConfig, FlashNext]:
    """The model of config dict `raw` (any family) with random weights, made on `device`
    tensor by tensor; quantize="fp8": the converted linears in block FP8 (module docstring),
    kept as Fp8Weight under weights="fp8" or dequantized to dtype under "dequantized" (None:
    fp8_weights.weight_format decides, FP8 on CUDA, as the loader does); ple_tables="host":
    the n-gram tables in pinned host memory, in 8 bits with table_dtype="int8"."""
    host_tables.check_table_dtype(table_dtype, ple_tables)
    if quantize not in (None, "fp8"):
        raise ValueError(f"quantization {quantize!r} is not supported (only fp8)")
    cfg = ModelConfig.from_hf(raw)
    with torch.device("meta"):
        model = build_model(cfg)
    fp8 = install_empty_fp8(model, QuantSpec()) if quantize == "fp8" else set()
    buffers = dict(model.named_buffers())  # the PLE's hash constants: computed, not drawn
    state = {}
    for name, meta in model.state_dict().items():
        if name in buffers:
            state[name] = buffers[name].to(device)
        elif name.endswith(".scale_inv") and name.removesuffix(".scale_inv") in fp8:
            continue  # drawn with its values
        elif name.endswith(".q") and name.removesuffix(".q") in fp8:
            base = name.removesuffix(".q")
            state[name], state[base + ".scale_inv"] = _fp8_tensor(base, meta.shape, device, seed)
        elif ple_tables == "host" and is_table(name):
            state.update(_host_table(name, tuple(meta.shape), dtype, device, seed, table_dtype))
        else:
            state[name] = random_tensor(name, tuple(meta.shape), dtype, device, seed)
    if table_dtype == "int8":
        host_tables.expect_int8_tables(model, dtype)
    model.load_state_dict(state, assign=True, strict=True)
    if fp8 and (weights or weight_format(device, QuantSpec())) == "dequantized":
        dequantize_modules(model, dtype)
    mark_tables(model, ple_tables)
    model.rotary = type(model.rotary)(cfg.rotary_dim, cfg.rope_theta)
    return cfg, model.eval().requires_grad_(False)


def _fp8_tensor(
    name: str, shape: torch.Size, device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 draw of `name` quantized to block FP8 on the device: (e4m3, scale_inv); an
    expert stack _EXPERTS_AT_ONCE experts at a time."""
    x = random_tensor(name, tuple(shape), torch.float32, device, seed)
    if x.ndim == 2:
        return quantize_blocks(x)
    parts = [quantize_blocks(c) for c in x.split(_EXPERTS_AT_ONCE)]
    del x
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def _host_table(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device, seed: int, table_dtype: str
) -> dict[str, torch.Tensor]:
    """An n-gram table's state in pinned host memory, drawn on `device` a slice of rows at a
    time from its generator (other values than random_tensor's one draw, the same
    distribution), in dtype or as its 8-bit pair (`...q`, `...scale`: host_tables.int8_state's
    names) quantized from the slice in dtype."""
    device = torch.device(device)
    gen = _generator(seed, name, device)
    eight = table_dtype == "int8"
    out = torch.empty(shape, dtype=torch.int8 if eight else dtype)
    scale = torch.empty(shape[0] if eight else 0, dtype=torch.float32)
    for start in range(0, shape[0], _TABLE_ROWS_AT_ONCE):
        rows = out[start : start + _TABLE_ROWS_AT_ONCE]
        draw = (torch.randn(rows.shape, generator=gen, device=device) * 0.02).to(dtype)
        if eight:
            q, s = quantize_rows(draw)
            rows.copy_(q)
            scale[start : start + rows.shape[0]].copy_(s)
        else:
            rows.copy_(draw)
    if not eight:
        return {name: pinned(out)}
    base = name.removesuffix(".weight")
    return {base + ".q": pinned(out), base + ".scale": pinned(scale)}


def transformers_classes(model_type: str):
    """transformers' (causal LM class, config class) for a text model_type of ours."""
    import transformers as t

    classes = {
        "qwen4_exp_text": (t.Qwen4ExpForCausalLM, t.Qwen4ExpTextConfig),
        "qwen3_next": (t.Qwen3NextForCausalLM, t.Qwen3NextConfig),
        "qwen3_5_text": (t.Qwen3_5ForCausalLM, t.Qwen3_5TextConfig),
        "qwen3_5_moe_text": (t.Qwen3_5MoeForCausalLM, t.Qwen3_5MoeTextConfig),
    }
    if model_type not in classes:
        raise ValueError(f"no transformers class for {model_type!r}; known: {sorted(classes)}")
    return classes[model_type]


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


# what a random model's sessions and workspace get beside its weights, when `auto` decides
# where its tables go (the engine then plans the sessions under its own limit)
_ROOM_BYTES = 16 << 30


def random_table_place(
    raw: dict, device: str, quantize: str | None, requested: str | None, table_dtype=None
) -> TablePlace:
    """Where a random model's n-gram tables go (`--ple-table-device`; the host for
    `--ple-table-dtype int8`); auto on CUDA: the GPU when its weights with the tables (bf16,
    or block FP8 with quantize) and _ROOM_BYTES fit 90% of the GPU's memory, else the host."""
    if table_dtype == "int8":
        return "host"
    if not str(device).startswith("cuda") or requested in ("cpu", "cuda"):
        return table_place(requested, str(device), True)
    from flashlane.models.weight_bytes import fp8_bytes, weight_bytes

    cfg = ModelConfig.from_hf(raw)
    weights = fp8_bytes(cfg, QuantSpec()).total_bytes if quantize else weight_bytes(cfg, 2)
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    return table_place(None, str(device), weights + _ROOM_BYTES <= 0.9 * total)
