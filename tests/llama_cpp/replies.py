"""llama.cpp's greedy replies against ours: equal, or parting only at a near tie."""

from __future__ import annotations


def count_equal_but_near_ties(llm, prompts, ours, theirs, near_tie: float) -> int:
    """How many replies are equal; each other one must part from ours where our logits of
    the two tokens differ by at most `near_tie` (asserted)."""
    same = 0
    for prompt, a, b in zip(prompts, ours, theirs):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            same += 1
            continue
        logits = llm.logits(prompt + a[:first]).double()
        logits = logits[-1] if logits.dim() > 1 else logits
        assert logits[a[first]] - logits[b[first]] <= near_tie, (first, a[first], b[first])
    return same
