"""Held-out evaluation of a Flash Next checkpoint and its MTP head, teacher forced.

Over windows of the held-out split (files chosen by training/corpus.py), each window
[x_0 .. x_{T+1}] gives:
- main loss: CE of the main head at t against x_{t+1}, t = 0..T-1;
- MTP loss: CE of MTP cell t (R_t with x_{t+1}) against x_{t+2};
- MTP acceptance at depth 1: the share of cells t = 0..T-2 whose argmax equals the main
  head's argmax at t+1, i.e. a greedy draft that greedy verification keeps.
Depths 2..4 need the engine's chained drafts (each draft fed back through the MTP layer with
its cache): `chained_acceptance` measures them from the engine's drafter and greedy target;
until the engine lands, the CLI reports them as null.

    python -m training.evaluate --model flashlane/default_model
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from flashlane.models.flashnext import FlashNext
from flashlane.models.loader import load_checkpoint
from training import corpus
from training.data import encode, windows

# drafts(prefix_ids, depth) -> up to `depth` greedy MTP-chain drafts that follow the target's
# own greedy token after the prefix (the engine's absorb + chain, DESIGN.md section 3).
ChainDrafter = Callable[[Sequence[int], int], list[int]]
# greedy(prefix_ids, n) -> the target's next n greedy tokens after the prefix.
GreedyTarget = Callable[[Sequence[int], int], list[int]]


@torch.no_grad()
def evaluate(
    model: FlashNext, windows: torch.Tensor, max_windows: int = 0, batch_size: int = 8
) -> dict:
    """windows [W, T+2] -> held-out losses, accuracies and depth-1 acceptance (fp32 means)."""
    if max_windows:
        windows = windows[:max_windows]
    device = model.embed_tokens.weight.device
    sums = dict.fromkeys(("main", "mtp", "main_acc", "mtp_acc", "accept"), 0.0)
    counts = dict.fromkeys(sums, 0)
    for i in range(0, windows.shape[0], batch_size):
        batch = windows[i : i + batch_size].to(device)
        t = batch.shape[1] - 2
        logits, residual = model.forward_train(batch[:, :t])
        mtp_logits, _ = model.mtp_forward_train(residual, batch[:, 1 : t + 1])
        main_pick, mtp_pick = logits.argmax(-1), mtp_logits.argmax(-1)
        parts = {
            "main": F.cross_entropy(
                logits.flatten(0, 1), batch[:, 1 : t + 1].flatten(), reduction="sum"
            ),
            "mtp": F.cross_entropy(
                mtp_logits.flatten(0, 1), batch[:, 2:].flatten(), reduction="sum"
            ),
            "main_acc": (main_pick == batch[:, 1 : t + 1]).sum(),
            "mtp_acc": (mtp_pick == batch[:, 2:]).sum(),
            "accept": (mtp_pick[:, :-1] == main_pick[:, 1:]).sum(),
        }
        for k, v in parts.items():
            sums[k] += v.item()
            counts[k] += batch.shape[0] * (t - 1 if k == "accept" else t)
    out = {k: round(sums[k] / max(1, counts[k]), 4) for k in sums}
    return {
        "main_loss": out["main"],
        "mtp_loss": out["mtp"],
        "main_top1": out["main_acc"],
        "mtp_top1": out["mtp_acc"],
        "mtp_accept_depth1": out["accept"],
        "num_windows": int(windows.shape[0]),
        "num_tokens": counts["main"],
    }


def chained_acceptance(
    drafter: ChainDrafter,
    greedy: GreedyTarget,
    docs: Sequence[Sequence[int]],
    max_depth: int = 4,
    stride: int = 64,
    min_prefix: int = 16,
) -> dict[int, float]:
    """Greedy acceptance by depth, from the engine's drafter and target (the depth 2..4 hook).

    At prefixes doc[:n] (n = min_prefix, min_prefix + stride, ...), the target's greedy
    continuation is g_0, g_1, ...; g_0 is the pending token and the drafter proposes the
    tokens after it. Depth d counts when drafts 1..d all equal g_1..g_d (cumulative, so the
    rate falls with depth). Nothing here can run without the engine: no numbers are invented.
    """
    hits, num_prefixes = [0] * max_depth, 0
    for doc in docs:
        for n in range(min_prefix, len(doc) - 1, stride):
            target = greedy(doc[:n], max_depth + 1)
            drafts = drafter(doc[:n], max_depth)
            num_prefixes += 1
            for d in range(max_depth):
                if len(drafts) <= d or drafts[d] != target[d + 1]:
                    break
                hits[d] += 1
    return {d + 1: round(hits[d] / max(1, num_prefixes), 4) for d in range(max_depth)}


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    n = torch.get_num_threads()
    return f"cpu ({n} thread{'s' if n > 1 else ''})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--max-windows", type=int, default=0, help="0: the whole split")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _, model = load_checkpoint(args.model, device=args.device)
    heldout = [f for f in corpus.list_files() if f.split == "heldout"]
    ids = encode(args.model / "tokenizer.json", list(corpus.read_documents(heldout)))
    result = evaluate(model, windows(ids, args.seq_len), args.max_windows)
    # TODO(issue 3): pass the engine's MTP chain and greedy target to chained_acceptance.
    result["mtp_accept_by_depth"] = None
    print(json.dumps(result))


if __name__ == "__main__":
    main()
