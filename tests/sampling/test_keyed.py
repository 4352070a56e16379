"""keyed.py: splitmix64, uniform and gumbel against the reference vectors, and the numpy and
torch versions against the scalar spec."""

import math

import numpy as np
import pytest
import torch

from flashlane.sampling import keyed
from flashlane.sampling.keyed import (
    GUMBEL_MAX,
    GUMBEL_MIN,
    U_MAX,
    U_MIN,
    gumbel,
    gumbel_np,
    gumbel_torch,
    row_key,
    row_keys_torch,
    splitmix64,
    splitmix64_np,
    splitmix64_torch,
    uniform,
    uniforms_np,
    uniforms_torch,
)
from tests.sampling import vectors


@pytest.fixture(scope="module")
def reference():
    return vectors.load()


def test_splitmix64_matches_every_vector(reference):
    for entry in reference["splitmix64"]:
        assert splitmix64(int(entry["x"])) == int(entry["out"]), entry


def test_uniform_and_gumbel_match_every_vector(reference):
    for entry in reference["uniform"]:
        u = uniform(entry["seed"], entry["position"], entry["token"])
        assert u == float(entry["u"]), entry
        assert gumbel(u) == float(entry["gumbel"]), entry


def _as_int64(values):
    return torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64)


# Edge inputs: zero, the top bit set (negative as int64), all ones, carries through the add.
EDGES = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0x61C8864680B583EB, 123456789]


def test_vectorised_splitmix64_equals_scalar():
    rng = np.random.default_rng(0)
    xs = EDGES + [int(x) for x in rng.integers(0, 2**64, 2000, dtype=np.uint64)]
    expected = [splitmix64(x) for x in xs]
    assert splitmix64_np(np.array(xs, dtype=np.uint64)).tolist() == expected
    got = splitmix64_torch(_as_int64(xs)).tolist()
    assert [g % 2**64 for g in got] == expected


@pytest.mark.parametrize("seed", [0, 1, 42, 2**63 - 1, 2**62 + 12345])
def test_vectorised_uniforms_equal_scalar(seed):
    rng = np.random.default_rng(seed % 1000)
    tokens = np.concatenate([[0, 1, 65535, 248319], rng.integers(0, 300_000, 3000)])
    for position in (0, 1, 262143, 10**9):
        expected = [uniform(seed, position, int(t)) for t in tokens]
        key = row_key(seed, position)
        assert uniforms_np(key, tokens).tolist() == expected
        keys = row_keys_torch([key], "cpu")
        got = uniforms_torch(keys[:, None], torch.from_numpy(tokens)[None, :])
        assert got[0].tolist() == expected


def test_uniform_is_strictly_inside_0_1():
    # u = ((h >> 12) + 0.5) * 2**-52 at the extreme hashes.
    assert ((0 >> 12) + 0.5) * 2.0**-52 == U_MIN == 2.0**-53
    assert (((2**64 - 1) >> 12) + 0.5) * 2.0**-52 == U_MAX == 1 - 2.0**-53
    assert U_MIN > 0.0 and U_MAX < 1.0
    assert math.isfinite(GUMBEL_MAX) and math.isfinite(GUMBEL_MIN)


def test_gumbel_bounds_hold_for_every_implementation():
    ends = np.array([U_MIN, U_MAX])
    assert gumbel_np(ends).tolist() == pytest.approx([GUMBEL_MIN, GUMBEL_MAX], rel=1e-15)
    # The pruning bound must be >= any noise the hash can give, whatever the library.
    assert float(gumbel_np(ends)[1]) <= GUMBEL_MAX + 1e-12
    assert float(gumbel_torch(torch.tensor(ends))[1]) <= GUMBEL_MAX + 1e-12


def test_gumbel_vectorised_close_to_scalar():
    u = np.random.default_rng(1).random(1000) * (1 - 2**-20) + 2**-21
    scalar = [gumbel(x) for x in u]
    # Equal up to the last bit of the library's log (DESIGN.md section 5).
    np.testing.assert_allclose(gumbel_np(u), scalar, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(gumbel_torch(torch.from_numpy(u)).numpy(), scalar, 1e-14, 1e-14)


def test_torch_shift_is_logical():
    x = _as_int64([2**64 - 1, 2**63])
    assert keyed._shr(x, 12).tolist() == [(2**64 - 1) >> 12, 2**63 >> 12]
