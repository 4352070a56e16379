"""The draws follow the filtered softmax: a chi-square test over 20,000 seeds."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec, draw

try:
    from scipy.stats import chi2 as scipy_chi2
except ImportError:
    scipy_chi2 = None


def chi2_survival(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x): the regularised upper gamma Q(df/2, x/2)."""
    a, x = df / 2.0, x / 2.0
    log_front = -x + a * math.log(x) - math.lgamma(a) if x > 0 else -math.inf
    if x < a + 1.0:  # the series for P converges here
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= x / (a + n)
            total += term
        return 1.0 - total * math.exp(log_front)
    # Lentz's continued fraction for Q.
    b, c, d = x + 1.0 - a, 1e300, 1.0 / (x + 1.0 - a)
    h = d
    for n in range(1, 1000):
        an, b = -n * (n - a), b + 2.0
        d = 1.0 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * math.exp(log_front)


def test_chi2_survival_known_values():
    for x, df, p in [(3.841458820694124, 1, 0.05), (18.307038053275146, 10, 0.05), (0.0, 3, 1.0)]:
        assert chi2_survival(x, df) == pytest.approx(p, rel=1e-9)
    if scipy_chi2 is not None:
        assert chi2_survival(7.3, 5) == pytest.approx(scipy_chi2.sf(7.3, 5), rel=1e-9)


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05),
        dict(temperature=1.3),
    ],
)
def test_draws_follow_the_filtered_softmax(params):
    logits = [1.2, -0.3, 2.0, 0.4, 1.9, -1.0, 0.0, 0.9, 1.5, -2.0]
    row = torch.tensor(logits, dtype=torch.float32)
    probs = filtered_softmax(np.array(logits, dtype=np.float32).astype(np.float64), params)
    counts = np.zeros(len(logits))
    spec = DrawSpec(SamplingParams(**params), 0, 3)
    for seed in range(20_000):
        counts[draw(row, replace(spec, seed=seed * 7919 + 1))] += 1
    assert counts[probs == 0].sum() == 0
    expected = probs[probs > 0] * counts.sum()
    assert expected.min() >= 5
    stat = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    assert chi2_survival(stat, int((probs > 0).sum()) - 1) > 0.001


def filtered_softmax(l, params):
    """DESIGN.md section 5's distribution, written independently for a short row."""
    z = l / params["temperature"]
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))
    order = order[: params.get("top_k") or len(z)]
    e = np.exp(z - z.max())
    if params.get("top_p", 1.0) < 1.0:
        target, running = params["top_p"] * sum(e[i] for i in sorted(order)), 0.0
        for n, i in enumerate(order):
            running += e[i]
            if running >= target:
                order = order[: n + 1]
                break
    order = [i for i in order if e[i] >= params.get("min_p", 0.0)]
    probs = np.zeros(len(z))
    probs[order] = e[order] / e[order].sum()
    return probs
