"""The [B, V] buffers a lone driver's keyed draws keep (sampling/lone_draw.py): a step's fp32
logits held for the host (`held`) and the adjusted rows' reply counts, prompt ids and bias
(sampling/adjusted_draw.py), one buffer each, shared by the draws of every size.

Each size of the driver's steps (runner/lone.py: 1, 2, 4, ... sessions) has a draw of its own,
and each kept its own [B, V] buffers, made at its first call with such rows: up to twice the
sessions' rows of vocabulary-wide buffers (2.2 GB for 256 sessions of Flash Next's 248,320
ids), made while serving, outside the memory plan. Here a draw of B rows takes the first B rows
of a buffer made once for the driver's largest size, which the plan counts for each session
(`BYTES_PER_ID`, planning/memory.py). Sharing is safe because the driver runs one call at a
time and a call's steps land before the next call loads, and a draw writes every row it reads
at its load (counts, prompt ids, bias) or in the step (the held logits). The buffers' addresses
never change once made: the driver's CUDA graphs hold them.
"""

from __future__ import annotations

import torch

__all__ = ["BYTES_PER_ID", "DTYPES", "VocabRows"]

# a session's row of each buffer, a vocabulary id each: held fp32 logits, int32 counts, bool
# prompt ids, float64 bias
DTYPES = {"held": torch.float32, "counts": torch.int32, "seen": torch.bool, "bias": torch.float64}
BYTES_PER_ID = sum(torch.empty(0, dtype=d).element_size() for d in DTYPES.values())


class VocabRows:
    """The driver's shared [rows, vocab] buffers by name (`DTYPES`), made at first use."""

    def __init__(self, rows: int, vocab: int, device: torch.device):
        self.rows, self.vocab, self.device = rows, vocab, device
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, b: int) -> torch.Tensor:
        """The first b rows of buffer `name` (zeros when made). A b past the rows it was made
        for makes it anew for b (the older views stay valid, each its own memory): only an
        eager driver's steps can ask for more rows than its largest size."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < b:
            rows = max(b, self.rows)
            buf = torch.zeros(rows, self.vocab, dtype=DTYPES[name], device=self.device)
            self.buffers[name] = buf
        return buf[:b]

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())
