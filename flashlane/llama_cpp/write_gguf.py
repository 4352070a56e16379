"""The GGUF of a checkpoint we measure, written by llama.cpp's own converter.

    python -m flashlane.llama_cpp.write_gguf --config flashnext-4l --seed 0 --device cuda \
        --out .peer/gguf/flashnext-4l-seed0.gguf --llama-src .peer/src
    python -m flashlane.llama_cpp.write_gguf --config qwen3-next-4l --seed 0 --device cuda \
        --out .peer/gguf/qwen3-next-4l-seed0-bf16.gguf --llama-src .peer/src
    python -m flashlane.llama_cpp.write_gguf --checkpoint flashlane/default_model --out m.gguf ...

Every family goes to its own llama.cpp arch (converter_fixes.CONVERTERS): Flash Next to
qwen4exp, Qwen3-Next to qwen3next, Qwen3.5 to qwen35, Qwen3.5-MoE to qwen35moe.
A random checkpoint (--config) is never written as safetensors: the converter reads a lazy
index whose tensors `random_tensor` makes on --device in bf16, one at a time as the writer
reaches them, so llama.cpp holds exactly the numbers `build_random(config, seed)` gives us.
A sidecar `<out>.json` names what the file holds; a later call for the same checkpoint keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from flashlane.llama_cpp import converter_fixes
from flashlane.models.build import build_model
from flashlane.models.config import ModelConfig
from flashlane.models.presets import PRESETS, config_dict
from flashlane.models.random_weights import random_tensor

DEFAULT_TOKENIZER = Path(__file__).resolve().parents[1] / "default_model"
EXPERTS = re.compile(r"^(.*\.experts)\.(gate_proj|up_proj|down_proj)$")
GDN_INPUTS = re.compile(r"^(.*\.linear_attn)\.in_proj_(qkv|z|b|a)\.weight$")
# Qwen3-Next's checkpoints fuse our GDN input projections in pairs: first -> (second, fused)
FUSED_GDN = {"qkv": ("z", "qkvz"), "b": ("a", "ba")}


class Progress:
    """Prints a timestamped line at each further tenth of the bytes made."""

    def __init__(self, total: int):
        self.total, self.done, self.next, self.t0 = total, 0, 0.1, time.perf_counter()

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        while self.done >= self.next * self.total and self.next <= 1.0:
            print(
                f"[{time.strftime('%H:%M:%S')}] gguf: {self.next:.0%} of "
                f"{self.total / 1e9:.1f} GB made ({time.perf_counter() - self.t0:.0f} s)",
                flush=True,
            )
            self.next += 0.1


def random_index(raw: dict, seed: int, device, dtype=torch.bfloat16) -> dict[str, tuple]:
    """Checkpoint name -> (shape, dtype, make) for the random checkpoint of `raw` (any family)
    and `seed`: the names save_checkpoint writes, except the experts, given fused as
    transformers saves them (`experts.gate_up_proj` [E, 2F, H], `experts.down_proj` [E, H, F]),
    and Qwen3-Next's GDN input projections, fused per key head as its checkpoints hold them
    (`in_proj_qkvz`, `in_proj_ba`: loader.split_fused_gdn's inverse; its converter reads only
    those). make() returns the CPU tensor, drawn on `device` by random_tensor under our names."""
    cfg = ModelConfig.from_hf(raw)
    with torch.device("meta"):
        model = build_model(cfg)
    buffers = dict(model.named_buffers())
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    progress = Progress(sum(2 * _numel(s) for n, s in shapes.items() if n not in buffers))

    def made(name: str, shape: tuple, rows: slice = slice(None)) -> torch.Tensor:
        t = random_tensor(name, shape, dtype, device, seed)[rows].cpu()
        progress.add(t.numel() * t.element_size())
        return t

    out: dict[str, tuple] = {}
    for name, shape in shapes.items():
        hf = _hf_prefix(name)
        gdn = GDN_INPUTS.match(name) if cfg.family == "qwen3_next" else None
        if name in buffers:
            value = buffers[name].clone()
            out[hf] = (shape, value.dtype, lambda v=value: v)
        elif m := EXPERTS.match(name):
            if m[2] == "down_proj":
                out[hf] = (shape, dtype, lambda n=name, s=shape: made(n, s))
            elif m[2] == "gate_proj":
                gate, up = name, f"{m[1]}.up_proj"
                fused = (shape[0], 2 * shape[1], shape[2])
                out[f"{_hf_prefix(m[1])}.gate_up_proj"] = (fused, dtype, lambda g=gate, u=up,
                    s=shape: torch.cat([made(g, s), made(u, s)], dim=1))  # fmt: skip
        elif gdn:
            if gdn[2] in FUSED_GDN:
                out.update(_fused_gdn(cfg, gdn[1], gdn[2], shapes, dtype, made))
        elif name.endswith("ngram_embedding.weight"):
            out.update(_shards(hf, name, shape, cfg.split_ngram_parts, dtype, made))
        else:
            out[hf] = (shape, dtype, lambda n=name, s=shape: made(n, s))
    return out


def _hf_prefix(name: str) -> str:
    return name if name.startswith(("lm_head.", "mtp.")) else "model." + name


def _fused_gdn(cfg: ModelConfig, base: str, first: str, shapes: dict, dtype, made) -> dict:
    """Qwen3-Next's fused projection of our `first` ("qkv" or "b") and its pair ("z", "a"):
    per key head, that head's q, k, v and z rows (b and a rows) side by side."""
    second, fused = FUSED_GDN[first]
    names = [f"{base}.in_proj_{part}.weight" for part in (first, second)]
    rows, cols = sum(shapes[n][0] for n in names), shapes[names[0]][1]
    nk, qk = cfg.linear_num_k_heads, cfg.linear_num_k_heads * cfg.linear_k_head_dim

    def make() -> torch.Tensor:
        one, two = (made(n, shapes[n]) for n in names)
        parts = [*one.split([qk, qk, one.shape[0] - 2 * qk]), two] if first == "qkv" else [one, two]
        return torch.cat([t.unflatten(0, (nk, -1)) for t in parts], dim=1).flatten(0, 1)

    return {f"{_hf_prefix(base)}.in_proj_{fused}.weight": ((rows, cols), dtype, make)}


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _shards(hf: str, name: str, shape: tuple, parts: int, dtype, made: Callable) -> dict:
    """The PLE table as save_checkpoint shards it: `parts` chunks along the rows."""
    rows = torch.empty(shape[0], device="meta").chunk(parts)
    out = {}
    for k, chunk in enumerate(rows):
        start = sum(r.shape[0] for r in rows[:k])
        out[hf.replace("ngram_embedding.weight", f"ngram_embedding.shard_{k}.weight")] = (
            (chunk.shape[0], shape[1]), dtype,
            lambda a=start, b=start + chunk.shape[0]: made(name, shape, slice(a, b)),
        )  # fmt: skip
    return out


def stamp(raw: dict, seed: int | None, checkpoint: Path | None) -> dict:
    """What a GGUF holds, written beside it: a later run reuses the file only if it matches."""
    return {
        "config": raw,
        "seed": seed,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "dtype": "bf16",
        "converter": "llama.cpp b11434 + flashlane.llama_cpp fixes",
    }


def write_gguf(
    out: Path,
    src: Path,
    raw: dict | None = None,
    seed: int = 0,
    device="cpu",
    checkpoint: Path | None = None,
    tokenizer: Path = DEFAULT_TOKENIZER,
) -> bool:
    """Write the GGUF of `checkpoint` (a folder with config.json and model.safetensors) or of
    the random checkpoint of (`raw`, `seed`) made on `device`; False if `out` already holds it."""
    if (raw is None) == (checkpoint is None):
        raise ValueError("write_gguf: give a config (random weights) or a checkpoint, not both")
    if checkpoint is not None:
        raw = json.loads((checkpoint / "config.json").read_text())
        tokenizer = checkpoint if (checkpoint / "tokenizer.json").is_file() else tokenizer
    words = len(json.loads((tokenizer / "tokenizer.json").read_text())["model"]["vocab"])
    if raw["vocab_size"] < words:
        # the converter lists the tokenizer's words as the vocabulary, padded up to vocab_size
        raise ValueError(
            f"write_gguf: vocab_size {raw['vocab_size']} is under the "
            f"tokenizer's {words} words ({tokenizer})"
        )
    # compared as JSON reads it back (a tuple in a config is a list there)
    want = json.loads(json.dumps(stamp(raw, None if checkpoint else seed, checkpoint)))
    side = Path(str(out) + ".json")
    if out.is_file() and side.is_file() and json.loads(side.read_text()) == want:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tempfile.TemporaryDirectory(prefix="flashlane-gguf-") as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(converter_fixes.converter_config(raw)))
        converter_fixes.tokenizer_folder(tokenizer, folder)
        tensors = None
        if checkpoint is not None:
            for f in checkpoint.glob("model*.safetensors*"):
                os.symlink(f.resolve(), folder / f.name)
        else:
            tensors = random_index(raw, seed, device)
        converter_fixes.convert(src, folder, partial, tensors)
    partial.replace(out)
    side.write_text(json.dumps(want))
    return True


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--config",
        help=f"random weights of a preset ({', '.join(sorted(PRESETS))}) or a config.json",
    )
    what.add_argument("--checkpoint", type=Path, help="a folder with model.safetensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the random weights are made")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--llama-src", type=Path, required=True, help="the llama.cpp source tree")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (convert ops)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    wrote = write_gguf(
        args.out,
        args.llama_src,
        config_dict(args.config) if args.config else None,
        args.seed,
        args.device,
        args.checkpoint,
    )
    size = args.out.stat().st_size / 1e9
    verb = "wrote" if wrote else "kept (already written)"
    print(
        f"[{time.strftime('%H:%M:%S')}] gguf: {verb} {args.out} ({size:.1f} GB, "
        f"{time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
