"""Train the embedded default model: a tiny qwen4_exp (Flash Next) with its MTP head.

loss = CE(main head, x_{t+1}) + mtp_weight * CE(MTP head, x_{t+2}) + router balance + the QSA
indexer's KL to dense attention (training/aux_losses.py), AdamW with linear warmup and cosine
decay, on the stdlib corpus (training/corpus.py) tokenized with the shipped tokenizer and
packed into windows of seq_len + 2 tokens. Seeded: the init, the
window order and the steps are fixed by --seed and the preset, so a rerun on the same
interpreter, torch and device gives the same losses.

    python -m training.train_tiny --preset cpu --out flashlane/default_model
    python -m training.train_tiny --preset gpu --out flashlane/default_model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.loader import init_weights, save_checkpoint
from training import corpus, evaluate, model_card
from training.aux_losses import AuxLosses
from training.config import PRESETS, Preset, tiny_config
from training.data import batch_order, encode, windows

DEFAULT_MODEL = Path(__file__).parents[1] / "flashlane" / "default_model"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "tokenizer_corpus.json",
)


def lr_at(step: int, p: Preset) -> float:
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    frac = (step - p.warmup) / max(1, p.steps - p.warmup)
    return p.lr * (p.min_lr_ratio + (1 - p.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def losses(model: FlashNext, batch: torch.Tensor, aux: AuxLosses) -> dict[str, torch.Tensor]:
    """batch [B, T+2] -> main CE (x_{t+1}), MTP CE (x_{t+2}), router balance, indexer KL."""
    t = batch.shape[1] - 2
    logits, residual = model.forward_train(batch[:, :t])
    main = F.cross_entropy(logits.flatten(0, 1), batch[:, 1 : t + 1].flatten())
    mtp_logits, _ = model.mtp_forward_train(residual, batch[:, 1 : t + 1])
    mtp = F.cross_entropy(mtp_logits.flatten(0, 1), batch[:, 2:].flatten())
    return {"main": main, "mtp": mtp, **aux.take()}


def make_optimizer(model: FlashNext, p: Preset) -> torch.optim.AdamW:
    decay = [q for q in model.parameters() if q.ndim >= 2]
    rest = [q for q in model.parameters() if q.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": p.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=p.lr, betas=(0.9, 0.95), eps=1e-8)


def train(
    config: dict,
    train_ids: torch.Tensor,
    p: Preset,
    seed: int,
    log: Callable[[dict], None] = print,
    heldout: torch.Tensor | None = None,
) -> tuple[FlashNext, dict]:
    """Train a fresh model of `config` on the id stream; returns it (fp32) and a summary.

    heldout: windows [W, T+2] evaluated every p.eval_every steps (time not counted as training).
    """
    torch.manual_seed(seed)
    device = torch.device(p.device)
    model = FlashNext(ModelConfig.from_hf(config))
    init_weights(model, seed)
    model.to(device).train()
    aux = AuxLosses(model)
    opt = make_optimizer(model, p)
    data = windows(train_ids, p.seq_len)
    order = batch_order(data.shape[0], p.batch_size, seed)
    t0, seen, recent, final = time.perf_counter(), 0, [], {}
    for step in range(p.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, p)
        batch = data[next(order)].to(device)
        parts = losses(model, batch, aux)
        loss = (parts["main"] + p.mtp_weight * parts["mtp"] + p.balance_weight * parts["balance"]
                + p.indexer_weight * parts["indexer"])  # fmt: skip
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), p.grad_clip).item()
        opt.step()
        seen += batch.shape[0] * p.seq_len
        recent.append({k: v.item() for k, v in parts.items()})
        elapsed = time.perf_counter() - t0
        last = step == p.steps - 1 or elapsed > p.max_minutes * 60
        if (step + 1) % p.log_every == 0 or step == 0 or last:
            final = {k: round(sum(r[k] for r in recent) / len(recent), 4) for k in recent[0]}
            log({"step": step + 1, **final, "lr": round(lr_at(step, p), 6),
                 "grad_norm": round(grad_norm, 3), "tokens": seen,
                 "tokens_per_s": round(seen / elapsed), "seconds": round(elapsed, 1)})  # fmt: skip
            recent = []
        if heldout is not None and p.eval_every and (step + 1) % p.eval_every == 0 and not last:
            result = evaluate.evaluate(model, heldout, p.eval_windows)
            log({"step": step + 1, "heldout_main": result["main_loss"],
                 "heldout_mtp": result["mtp_loss"],
                 "accept1": result["mtp_accept_depth1"]})  # fmt: skip
            t0 += time.perf_counter() - t0 - elapsed
        if last:
            break
    model.eval()
    summary = {"steps": step + 1, "stopped_early": step < p.steps - 1, "tokens": seen,
               "seconds": round(elapsed, 1), "tokens_per_s": round(seen / elapsed),
               "train_main": final["main"], "train_mtp": final["mtp"]}  # fmt: skip
    return model, summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help="override the preset's step count")
    parser.add_argument("--batch-size", type=int, help="override the preset's batch size")
    parser.add_argument("--threads", type=int, help="override the preset's CPU threads")
    parser.add_argument("--eval-every", type=int, help="override the preset's eval interval")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_MODEL / "tokenizer.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    given = {"steps": args.steps, "batch_size": args.batch_size, "threads": args.threads,
             "eval_every": args.eval_every}  # fmt: skip
    p = replace(PRESETS[args.preset], **{k: v for k, v in given.items() if v is not None})
    if p.threads:
        torch.set_num_threads(p.threads)
    if p.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    command = "python -m training.train_tiny " + shlex.join(argv or sys.argv[1:])
    files = corpus.list_files()
    split = {s: [f for f in files if f.split == s] for s in ("train", "heldout")}
    ids = {s: encode(args.tokenizer, list(corpus.read_documents(fs))) for s, fs in split.items()}
    heldout = windows(ids["heldout"], p.seq_len)
    run = {"command": command, "seed": args.seed, "preset": args.preset, "config": asdict(p),
           "device": evaluate.device_name(p.device), "torch": torch.__version__,
           "python": sys.version.split()[0], "train_tokens": ids["train"].numel(),
           "heldout_tokens": ids["heldout"].numel(), "log": []}  # fmt: skip
    print(json.dumps({k: v for k, v in run.items() if k != "log"}), flush=True)

    def log(entry: dict) -> None:
        run["log"].append(entry)
        print(json.dumps(entry), flush=True)

    config = tiny_config()
    model, run["summary"] = train(config, ids["train"], p, args.seed, log, heldout)
    # What ships is bf16: evaluate the rounded weights, not the fp32 ones.
    with torch.no_grad():
        for q in model.parameters():
            q.copy_(q.to(torch.bfloat16))
    run["heldout"] = evaluate.evaluate(model, heldout)
    print(json.dumps({"summary": run["summary"], "heldout": run["heldout"]}), flush=True)
    save_checkpoint(model.cpu(), config, args.out, dtype=torch.bfloat16)
    tok_dir = args.tokenizer.parent
    for name in TOKENIZER_FILES:
        if (tok_dir / name).resolve() != (args.out / name).resolve():
            shutil.copyfile(tok_dir / name, args.out / name)
    corpus.write_manifest(files, args.out / "corpus_manifest.json")
    (args.out / "train_log.json").write_text(json.dumps(run, indent=1) + "\n")
    model_card.write(args.out)


if __name__ == "__main__":
    main()
