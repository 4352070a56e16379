"""Token streams and packed windows for training and evaluation.

The corpus's documents become one id stream with EOS between files; windows of seq_len + 2
ids at stride seq_len feed the model seq_len ids and give each position its next token (main
head) and the token after it (MTP head). The window order is a seeded permutation per epoch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer

from training.tokenizer import EOS


def encode(tokenizer_path: Path, docs: Sequence[str]) -> torch.Tensor:
    """All documents as one id stream [N] with EOS between them (corpus.join_documents)."""
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for i, enc in enumerate(tok.encode_batch(list(docs))):
        if i:
            ids.append(eos)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Windows [W, seq_len + 2] at stride seq_len: every token is a main-head target once."""
    if stream.numel() < seq_len + 2:
        raise ValueError(f"{stream.numel()} tokens cannot fill one window of {seq_len + 2}")
    return stream.unfold(0, seq_len + 2, seq_len)


def batch_order(num_windows: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Window indices per step: a seeded permutation per epoch, no partial batches."""
    if num_windows < batch_size:
        raise ValueError(f"{num_windows} windows cannot fill a batch of {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    while True:
        perm = torch.randperm(num_windows, generator=gen)
        for i in range(0, num_windows - batch_size + 1, batch_size):
            yield perm[i : i + batch_size]
