"""Which Triton kernel makes a sibling's logits leave the references' (issue 33's GPU check).

    python benchmarks/sibling_kernel_bisect.py [NAME ...]     # on the GPU; NAME: qwen3_5_moe

For each tiny sibling checkpoint (tests/oracle.py, seed 5, fp32) the logits of three pieces
(whole, recurrent, recurrent) on the reference kernels against: every Triton kernel; every
Triton kernel but fla's chunked GDN; and each Triton kernel alone on the references. Prints
the largest difference over the largest logit for each; tests/kernels/test_triton_siblings.py
asks for <= 1e-4.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

from flashlane.kernels import REFERENCE
from flashlane.kernels.gdn import triton as gdn_tr
from flashlane.kernels.gpu import TRITON
from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from tests.oracle import SIBLINGS, build_oracle


def logits(ckpt, kernels, device) -> torch.Tensor:
    ids = torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(1))
    cfg, model = load_checkpoint(ckpt, torch.float32, device)
    model.use_kernels(kernels)
    s = SessionState.empty(cfg, 64, torch.float32, torch.float32, device)
    pieces = [(0, 8, False), (8, 11, True), (11, 12, True)]
    return torch.cat([run_piece(model, s, ids[a:b], a, rec) for a, b, rec in pieces])


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fields = [f.name for f in dataclasses.fields(TRITON) if f.name != "name"]
    names = sys.argv[1:] or sorted(SIBLINGS)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            spec = SIBLINGS[name]
            ckpt = build_oracle(Path(tmp) / name, spec, seed=5)
            ref = logits(ckpt, REFERENCE, device)
            scale = ref.abs().max().item()

            def err(kernels, ckpt=ckpt, ref=ref, scale=scale) -> float:
                return (logits(ckpt, kernels, device) - ref).abs().max().item() / scale

            print(f"== {name}: largest logit {scale:.3f}", flush=True)
            print(f"  {'all Triton':32s} {err(TRITON):.2e}", flush=True)
            fla = gdn_tr._fla_chunk
            gdn_tr._fla_chunk = lambda: None
            try:
                print(f"  {'all Triton, no fla':32s} {err(TRITON):.2e}", flush=True)
            finally:
                gdn_tr._fla_chunk = fla
            for f in fields:
                e = err(dataclasses.replace(REFERENCE, **{f: getattr(TRITON, f)}))
                if e > 1e-5:
                    print(f"  {'only ' + f:32s} {e:.2e}", flush=True)


if __name__ == "__main__":
    main()
