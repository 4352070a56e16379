"""What the simulated-node tests run under torchrun: `flashlane generate` (argv) on this tree,
or with `--check-group`, a join and one collective of each kind, printed as JSON by rank 0."""

from __future__ import annotations

import json
import sys

import torch


def check_group() -> None:
    from flashlane.parallel.group import join, leave

    tp = join("cpu", 2)
    x = torch.full((2, 3), float(tp.rank + 1), dtype=torch.float64)
    summed = tp.all_reduce(x)
    side = tp.gather_columns(x)
    said = tp.broadcast({"from": tp.rank})
    if tp.is_leader:
        print(json.dumps({"sum": summed.tolist(), "side": side.tolist(), "said": said}))
    leave()


if __name__ == "__main__":
    if sys.argv[1:] == ["--check-group"]:
        check_group()
    else:
        from flashlane.cli import main

        sys.exit(main())
