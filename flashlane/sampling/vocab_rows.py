"""The [B, V] buffers a lone driver's keyed draws keep (sampling/lone_draw.py): a step's fp32
logits held for the host (`held`) and the adjusted rows' reply counts and prompt ids, with
their bias ids and values (sampling/adjusted_draw.py, BIAS_IDS a row), one buffer each,
shared by the draws of every size.

Each size of the driver's steps (runner/lone.py: 1, 2, 4, ... sessions) has a draw of its own,
and each kept its own [B, V] buffers, made at its first call with such rows: up to twice the
sessions' rows of vocabulary-wide buffers (2.2 GB for 256 sessions of Flash Next's 248,320 ids
with the bias then a float64 row), made while serving, outside the memory plan. Here a draw of
B rows takes the first B rows of a buffer made once for the driver's largest size, which the
plan counts for each session (`BYTES_PER_ID`, `BYTES_PER_ROW`; planning/memory.py). Sharing is
safe because the driver runs one call at a time and a call's steps land before the next call
loads, and a draw writes every row it reads at its load (counts, prompt ids, bias) or in the
step (the held logits). The buffers' addresses never change once made: the driver's CUDA
graphs hold them.
"""

from __future__ import annotations

import torch

__all__ = ["BIAS_IDS", "BYTES_PER_ID", "BYTES_PER_ROW", "SHAPES", "VocabRows"]

# logit_bias ids a row's draw takes on the device (more: the host draws the row)
BIAS_IDS = 1024
# each buffer's dtype and width (None: a vocabulary id each): held fp32 logits, int32 reply
# counts, bool prompt ids; the bias as ids and float64 values (-0.0 past a row's own)
SHAPES = {
    "held": (torch.float32, None),
    "counts": (torch.int32, None),
    "seen": (torch.bool, None),
    "bias_ids": (torch.int64, BIAS_IDS),
    "bias_values": (torch.float64, BIAS_IDS),
}


def _size(name: str) -> int:
    return torch.empty(0, dtype=SHAPES[name][0]).element_size()


# a session's row of every buffer: bytes a vocabulary id, and bytes besides
BYTES_PER_ID = sum(_size(n) for n, (_, w) in SHAPES.items() if w is None)
BYTES_PER_ROW = sum(_size(n) * w for n, (_, w) in SHAPES.items() if w is not None)


class VocabRows:
    """The driver's shared [rows, width] buffers by name (`SHAPES`), made at first use."""

    def __init__(self, rows: int, vocab: int, device: torch.device):
        self.rows, self.vocab, self.device = rows, vocab, device
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, name: str, b: int) -> torch.Tensor:
        """The first b rows of buffer `name` (zeros when made). A b past the rows it was made
        for makes it anew for b (the older views stay valid, each its own memory): only an
        eager driver's steps can ask for more rows than its largest size."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape[0] < b:
            dtype, width = SHAPES[name]
            shape = (max(b, self.rows), width or self.vocab)
            buf = torch.zeros(shape, dtype=dtype, device=self.device)
            self.buffers[name] = buf
        return buf[:b]

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers.values())
