"""Parity errors against transformers 5.17 and CPU forward speed of the tiny oracle models.

    PYTHONPATH=. python benchmarks/cpu_forward.py [--threads 2]

For each oracle config (REFERENCE.md's tiny one and the "other" one, every parameter random):
the max |ours - transformers| / max |logit| over a 256-token prompt with EOS inside, for the
full prompt and for 64-token pieces followed by one-token steps; then prefill tokens/s
(64-token pieces) and one-token decode steps/s on one session. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from tests.oracle import OTHER, TINY, build_oracle


def measure(folder: Path, name: str) -> dict:
    from transformers import Qwen4ExpForCausalLM

    from tests.models.test_parity import lower_id_ties

    hf = Qwen4ExpForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg, model = load_checkpoint(folder, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (256,), generator=g)
    ids[[40, 41, 150]] = cfg.eos_token_ids[0]
    with torch.no_grad(), lower_id_ties():
        ref = hf(ids.unsqueeze(0)).logits[0].double()
    scale = ref.abs().max().item()
    full = model.forward_train(ids.unsqueeze(0))[0][0].double()
    s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
    parts = [run_piece(model, s, ids[a : a + 64], a, False) for a in range(0, 192, 64)]
    parts += [run_piece(model, s, ids[p : p + 1], p, True) for p in range(192, 256)]
    stepped = torch.cat(parts).double()
    # speed: prefill in 64-token pieces, then one-token steps
    s = SessionState.empty(cfg, 1024, torch.float64, torch.float64)
    long = torch.randint(3, cfg.vocab_size, (512,), generator=g)
    t0 = time.perf_counter()
    for a in range(0, 512, 64):
        run_piece(model, s, long[a : a + 64], a, False)
    prefill = 512 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for p in range(512, 576):
        run_piece(model, s, long[p % 512 : p % 512 + 1], p, True)
    decode = 64 / (time.perf_counter() - t0)
    return {
        "config": name,
        "full_prompt_rel_err": (full - ref).abs().max().item() / scale,
        "pieces_and_steps_rel_err": (stepped - ref).abs().max().item() / scale,
        "prefill_tok_s": prefill,
        "decode_tok_s": decode,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec, seed in (("tiny", TINY, 0), ("other", OTHER, 3)):
            rows.append(measure(build_oracle(Path(tmp) / name, spec, seed), name))
    print(
        f"{'config':>6} {'full err':>10} {'pieces err':>10} {'prefill tok/s':>14} {'decode tok/s':>13}"
    )
    for r in rows:
        print(
            f"{r['config']:>6} {r['full_prompt_rel_err']:>10.2e} {r['pieces_and_steps_rel_err']:>10.2e} "
            f"{r['prefill_tok_s']:>14.0f} {r['decode_tok_s']:>13.1f}"
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "bench": "cpu_forward",
                "date": str(date.today()),
                "commit": commit,
                "device": f"cpu, {args.threads} threads, float64 compute",
                "command": f"PYTHONPATH=. python benchmarks/cpu_forward.py --threads {args.threads}",
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
