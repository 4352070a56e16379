"""What a draw depends on and how it fails, without torch or numpy: the lane core
(lanes/lone_turn.py) asks these when it hands streams to the lone driver, and the samplers
(choose.py, lone_draw.py) build on them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from flashlane.request import SamplingParams

GREEDY_TEMPERATURE = 1e-5  # below this a draw is the argmax

# A device draw's failure codes, in a token's place where its flag is 0 (a token is >= 0).
NO_CANDIDATE, UNSETTLED = -1, -3  # triton_draw's statuses
NAN_AT, INF_AT = -4, -5  # -4 - 2 id: the first NaN is at id; -5 - 2 id: the first +inf


@dataclass(frozen=True, slots=True)
class DrawSpec:
    """Everything one draw depends on besides the logits."""

    params: SamplingParams
    seed: int  # already reduced mod 2**63
    position: int  # absolute position of the token being drawn
    prompt_ids: Sequence[int] = ()  # seen ids for repetition_penalty (prompt part)
    reply_ids: Sequence[int] = ()  # the reply so far (repetition, presence, frequency)


class SampleError(ValueError):
    """This row cannot be drawn (a NaN or +inf logit, no finite candidate, an id outside the
    vocabulary); it fails only its own stream."""


def is_plain_greedy(spec: DrawSpec) -> bool:
    """Greedy with nothing that changes a logit: the draw is the row's first maximum."""
    p = spec.params
    return (
        p.temperature < GREEDY_TEMPERATURE
        and not p.logit_bias
        and p.repetition_penalty == 1.0
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
    )


def bad_logit(word: str, token_id: int) -> SampleError:
    """The error for a row whose first NaN (word "NaN"), or else first +inf ("+inf"), logit
    is at `token_id`: every path names it the same way."""
    return SampleError(f"{word} logit at id {token_id}")


def no_candidate(top: float) -> SampleError:
    """The error for a row whose largest adjusted logit `top` is not finite."""
    if top == -math.inf:
        return SampleError("no finite candidate logit")
    # Only an extreme logit_bias or repetition_penalty can overflow a float64 logit.
    return SampleError("a logit is +inf after logit_bias and penalties")


def failure(code: int) -> SampleError:
    """The shared rounds' error for a failed row's code. A code >= 0 comes from a greedy
    step (kernels.greedy_step flags the row's maximum only)."""
    if code >= 0:
        return SampleError("the row has no finite logit")
    if code == NO_CANDIDATE:
        return no_candidate(-float("inf"))
    if code <= NAN_AT:
        token_id, which = divmod(NAN_AT - code, 2)
        return bad_logit("+inf" if which else "NaN", token_id)
    return SampleError("the draw was not settled on the device")
