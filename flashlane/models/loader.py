"""Checkpoints: safetensors (one file or sharded with an index) <-> FlashNext parameters.

One name table turns checkpoint names into ours: the `model.` / `model.language_model.`
prefix goes, per-expert weights are stacked, the PLE table's shards are concatenated, and
Qwen3-Next's fused GDN projections (in_proj_qkvz, in_proj_ba) are cut into Qwen3.5's four.
The vision tower is not loaded. Errors name the tensor, the file and both shapes.
Block-FP8 tensors (models/fp8.py) are dequantized to the model's dtype as they are read, or,
where `models/fp8_weights.weight_format` says "fp8" (CUDA), kept as e4m3 values and scales in
Fp8Weight modules; `quantize="fp8"` quantizes a plain checkpoint's linears the same way first.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flashlane.models import host_tables, stream_load
from flashlane.models.build import build_model
from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.fp8 import (
    SCALE_SUFFIX,
    QuantizationError,
    QuantSpec,
    dequantize_state,
    quantize_blocks,
    read_quant_spec,
)
from flashlane.models.fp8_weights import WeightFormat, install_fp8, keeps, weight_format
from flashlane.models.host_tables import TablePlace, is_table, mark_tables
from flashlane.models.stream_load import CheckpointError, check_shape, load_table
from flashlane.models.table8 import TableDtype

logger = logging.getLogger("flashlane")

PREFIXES = ("model.language_model.", "model.")
IGNORED = (re.compile(r"^(model\.)?visual\."), re.compile(r"^model\.visual\."))
EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight(_scale_inv)?$")
# a fused expert stack and, in a kept FP8 checkpoint, its scales
SUFFIXES = ("", SCALE_SUFFIX)
SHARD = stream_load.SHARD


def _our_name(name: str) -> str | None:
    if any(p.match(name) for p in IGNORED):
        return None
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the file that holds it."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no model.safetensors and no model.safetensors.index.json")
    out: dict[str, Path] = {}
    for f in files:
        for name in _open(f).keys():  # noqa: SIM118 (a safe_open handle, not a dict)
            out[name] = f
    return out


def _open(path: Path):
    try:
        return safe_open(str(path), framework="pt")
    except Exception as err:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"{path}: cannot read safetensors ({err})") from None


def read_tensors(
    folder: Path,
    dtype: torch.dtype = torch.float32,
    quantize: str | None = None,
    weights: WeightFormat = "dequantized",
    names: list[str] | None = None,
    files: dict[str, Path] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Our name -> tensor, and our name -> source file (for error messages). Block-FP8 tensors
    come back dequantized to dtype, or with weights="fp8" as they are (`X` e4m3 and
    `X_scale_inv`, the experts' stacked as their weights are); quantize="fp8" first quantizes
    a plain checkpoint's linears (those QuantSpec() converts), so it loads the values its FP8
    checkpoint would hold. `names`: these checkpoint tensors only (a group, stream_load.py);
    `files`: checkpoint_files(folder), where the caller has it."""
    spec, fresh = _specs(folder, quantize)
    files = checkpoint_files(folder) if files is None else files
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in files if names is None else names:
        by_file[files[name]].append(name)
    total = sum(f.stat().st_size for f in by_file if f.exists())
    loud = total > 2**30 and names is None
    tensors, origin = {}, {}
    for i, (f, names) in enumerate(sorted(by_file.items())):
        if not f.exists():
            raise CheckpointError(f"{f}: listed in the index but missing")
        if loud:
            logger.info(
                "loading %s (%d/%d, %.1f GiB in all)", f.name, i + 1, len(by_file), total / 2**30
            )
        handle = _open(f)
        for name in names:
            ours = _our_name(name)
            if ours is None:
                continue
            try:
                tensors[ours] = handle.get_tensor(name)
            except Exception as err:
                raise CheckpointError(f"{f}: tensor {name!r} cannot be read ({err})") from None
            origin[ours] = f
            t = tensors[ours]
            if fresh is not None and t.ndim == 2 and fresh.is_converted(name):
                tensors[ours], tensors[ours + SCALE_SUFFIX] = quantize_blocks(t, fresh.block)
                origin[ours + SCALE_SUFFIX] = f
    try:
        tensors = dequantize_state(
            tensors, spec or fresh, dtype, keeps if weights == "fp8" else None
        )
    except QuantizationError as err:
        named = re.search(r"'([^']+)'", str(err))
        where = origin.get(named.group(1).removesuffix(SCALE_SUFFIX)) if named else None
        raise CheckpointError(f"{where or folder}: {err}") from None
    return _stack_experts(_join_shards(tensors, origin), origin), origin


def _specs(folder: Path, quantize: str | None) -> tuple[QuantSpec | None, QuantSpec | None]:
    """(the checkpoint's QuantSpec, the one quantize="fp8" applies to a plain checkpoint)."""
    if quantize not in (None, "fp8"):
        raise CheckpointError(f"quantization {quantize!r} is not supported (only fp8)")
    try:
        spec = read_quant_spec(folder)
    except QuantizationError as err:
        raise CheckpointError(str(err)) from None
    return spec, QuantSpec() if quantize == "fp8" and spec is None else None


def _join_shards(tensors: dict, origin: dict) -> dict:
    shards: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    for name in [n for n in tensors if SHARD.match(n)]:
        m = SHARD.match(name)
        shards[m.group(1)][int(m.group(2))] = tensors.pop(name)
        origin[m.group(1) + ".weight"] = origin[name]
    for base, parts in shards.items():
        if sorted(parts) != list(range(len(parts))):
            raise CheckpointError(
                f"{origin[base + '.weight']}: {base} shards are not 0..{len(parts) - 1}"
            )
        tensors[base + ".weight"] = torch.cat([parts[i] for i in range(len(parts))], dim=0)
    return tensors


def _stack_experts(tensors: dict, origin: dict) -> dict:
    groups: dict[tuple[str, str], dict[int, torch.Tensor]] = defaultdict(dict)
    for name in [n for n in tensors if EXPERT.match(n)]:
        m = EXPERT.match(name)
        proj = m.group(3) + (m.group(4) or "")  # an FP8 stack's scales: <proj>_scale_inv
        groups[(m.group(1), proj)][int(m.group(2))] = tensors.pop(name)
        origin[f"{m.group(1)}.{proj}"] = origin[name]
    for (base, proj), experts in groups.items():
        if sorted(experts) != list(range(len(experts))):
            raise CheckpointError(
                f"{origin[base + '.' + proj]}: {base}.*.{proj} are not 0..{len(experts) - 1}"
            )
        tensors[f"{base}.{proj}"] = torch.stack([experts[i] for i in range(len(experts))])
    for name in [
        n for n in tensors if n.endswith(tuple(".experts.gate_up_proj" + x for x in SUFFIXES))
    ]:
        # halves of FP8 rows halve the scales' rows (the inner size a multiple of 128)
        fused, tail = name.split(".experts.gate_up_proj")
        gate, up = tensors.pop(name).chunk(2, dim=1)
        base = fused + ".experts"
        tensors[base + ".gate_proj" + tail], tensors[base + ".up_proj" + tail] = gate, up
        origin[base + ".gate_proj" + tail] = origin[base + ".up_proj" + tail] = origin[name]
    return tensors


def load_checkpoint(
    folder: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    quantize: str | None = None,
    weights: WeightFormat | None = None,
    ple_tables: TablePlace = "device",
    table_dtype: TableDtype = "bf16",
) -> tuple[ModelConfig, FlashNext]:
    """Build the model of folder/config.json and fill it from the folder's safetensors
    (quantize="fp8": a plain checkpoint's linears quantized to block FP8 first). Block-FP8
    weights are kept FP8 (Fp8Weight) with weights="fp8", dequantized to dtype with
    "dequantized"; None: `fp8_weights.weight_format(device, ...)` decides (FP8 on CUDA).
    ple_tables="host": the n-gram tables stay in host memory (models/host_tables.py);
    table_dtype="int8" (host only): each quantized from dtype to 8 bits (models/table8.py)."""
    host_tables.check_table_dtype(table_dtype, ple_tables)
    folder = Path(folder)
    cfg = ModelConfig.from_hf(folder)
    spec, fresh = _specs(folder, quantize)
    if weights is None:
        weights = weight_format(device, spec or fresh)
    files = checkpoint_files(folder)
    ours = {n: o for n in files if (o := _our_name(n)) is not None}
    if cfg.num_mtp_layers and not any(o.startswith("mtp.") for o in ours.values()):
        logger.warning(
            "%s: config.json has %d MTP layer(s) but no mtp.* weights: MTP drafts "
            "off, copy drafts only",
            folder,
            cfg.num_mtp_layers,
        )
        cfg = replace(cfg, num_mtp_layers=0)  # no MTP head shipped: copy drafts only
    with torch.device("meta"):
        model = build_model(cfg)
    if table_dtype == "int8":
        host_tables.expect_int8_tables(model, dtype)
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for names in stream_load.groups(ours):  # one group in host memory at a time
        handles = stream_load.open_handles(files, names, _open)
        if stream_load.is_streamable(names, ours, handles, fresh):
            load_table(names, ours, handles, files, model, state, origin, dtype, device,
                       ple_tables, table_dtype)  # fmt: skip
            continue
        tensors, got = read_tensors(folder, dtype, quantize, weights, names, files)
        origin.update(got)
        tensors = split_fused_gdn(tensors, origin, cfg)
        fp8_names: set[str] = set()  # an Fp8Weight's tensors keep their dtypes
        if weights == "fp8":
            before = set(tensors)
            tensors = install_fp8(model, tensors)
            fp8_names = set(tensors) - before
            for name in fp8_names:
                origin[name] = origin.get(name.rsplit(".", 1)[0], folder)
        expected = dict(model.state_dict())
        for n, t in sorted(tensors.items()):
            check_shape(n, t, expected, origin)
            host = ple_tables == "host" and is_table(n)
            kept = dtype if t.is_floating_point() and n not in fp8_names else t.dtype
            t = t.to(device="cpu" if host else device, dtype=kept)
            state.update(host_tables.host_state(n, t, table_dtype) if host else {n: t})
        del tensors
    expected = dict(model.state_dict())
    if cfg.tie_word_embeddings and "lm_head.weight" not in state and "embed_tokens.weight" in state:
        state["lm_head.weight"] = state["embed_tokens.weight"].clone()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(
            f"{folder}: missing tensor {missing[0]!r} (expected shape "
            f"{tuple(expected[missing[0]].shape)}); {len(missing)} missing in all"
        )
    model.load_state_dict(state, assign=True, strict=True)
    mark_tables(model, ple_tables)
    model.rotary = type(model.rotary)(cfg.rotary_dim, cfg.rope_theta)
    return cfg, model.eval().requires_grad_(False)


def split_fused_gdn(tensors: dict, origin: dict, cfg: ModelConfig) -> dict:
    """Qwen3-Next's GDN input projections, fused per key head, as the four of Qwen3.5:
    in_proj_qkvz rows [K heads x (q Dk, k Dk, v r*Dv, z r*Dv)] -> in_proj_qkv (every q, then
    every k, then every v) and in_proj_z; in_proj_ba rows [K heads x (b r, a r)] -> in_proj_b
    and in_proj_a (r = value heads per key head)."""
    nk, dk, dv = cfg.linear_num_k_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim
    rep = cfg.linear_num_v_heads // nk
    for name in [n for n in tensors if n.endswith(".in_proj_qkvz.weight")]:
        base = name.removesuffix("in_proj_qkvz.weight")
        w = tensors.pop(name)
        if w.shape[0] != nk * (2 * dk + 2 * rep * dv):
            raise CheckpointError(
                f"{origin[name]}: tensor {name!r} has shape "
                f"{tuple(w.shape)}, the config's heads need "
                f"{nk * (2 * dk + 2 * rep * dv)} rows"
            )
        q, k, v, z = w.unflatten(0, (nk, -1)).split([dk, dk, rep * dv, rep * dv], dim=1)
        tensors[base + "in_proj_qkv.weight"] = torch.cat([t.flatten(0, 1) for t in (q, k, v)])
        tensors[base + "in_proj_z.weight"] = z.flatten(0, 1)
        ba = tensors.pop(base + "in_proj_ba.weight", None)
        if ba is None:
            raise CheckpointError(f"{origin[name]}: {name!r} without {base}in_proj_ba.weight")
        b, a = ba.unflatten(0, (nk, -1)).split([rep, rep], dim=1)
        tensors[base + "in_proj_b.weight"], tensors[base + "in_proj_a.weight"] = (
            b.flatten(0, 1),
            a.flatten(0, 1),
        )
        for part in ("qkv", "z", "b", "a"):
            origin[f"{base}in_proj_{part}.weight"] = origin[name]
    return tensors


def hf_tensors(model: FlashNext) -> dict[str, torch.Tensor]:
    """Our parameters under the checkpoint's names (per-expert weights, sharded PLE table)."""
    out = {}
    parts = model.cfg.split_ngram_parts
    for name, t in model.state_dict().items():
        t = t.detach().contiguous().cpu()
        hf = name if name.startswith(("lm_head.", "mtp.")) else "model." + name
        if re.search(r"\.experts\.(gate_proj|up_proj|down_proj)$", name):
            base, proj = hf.rsplit(".", 1)
            for e in range(t.shape[0]):
                out[f"{base}.{e}.{proj}.weight"] = t[e].clone()
        elif name.endswith("ngram_embedding.weight"):
            for k, shard in enumerate(t.chunk(parts, dim=0)):
                out[hf.replace("ngram_embedding.weight", f"ngram_embedding.shard_{k}.weight")] = (
                    shard.clone()
                )
        else:
            out[hf] = t
    return out


def save_checkpoint(
    model: FlashNext, config: dict, out_dir: str | Path, dtype: torch.dtype | None = None
) -> None:
    """config.json + model.safetensors with HF names (mtp.* included)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(model)
    if dtype is not None:
        tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def init_weights(model: FlashNext, seed: int, std: float = 0.02) -> None:
    """Deterministic training init: normal linears and embeddings, identity norms, the GDN
    decay range of the reference (A in [1, 16], dt_bias 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=gen).log())
            elif name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * (1 / p.shape[-1]) ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
