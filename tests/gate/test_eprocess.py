"""e_accept / e_futility: hand-computed values, bad input, order invariance, and validity.

Validity is checked exactly (no sampling): expectations by enumerating binomial outcomes, and
the anytime guarantee P(sup_n E >= 1/alpha) <= alpha by dynamic programming over (W, L) paths.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trm_gate import (
    DEFAULT_ACCEPT_GRID,
    DEFAULT_FUTILITY_GRID,
    GateInputError,
    e_accept,
    e_futility,
)


@pytest.mark.parametrize(
    ("deltas", "grid", "expected"),
    [
        ([], None, 1.0),
        ([1.0], [0.5], 1.5),
        ([1.0, -1.0], [0.5], 0.75),
        ([1.0, 1.0], [0.25, 0.5], (1.25**2 + 1.5**2) / 2),  # 1.90625
        ([0.5, -0.25, 0.0], [0.2, 0.4], (1.1 * 0.95 + 1.2 * 0.9) / 2),  # 1.0625
        ([1.0], None, 1 + sum(DEFAULT_ACCEPT_GRID) / len(DEFAULT_ACCEPT_GRID)),  # 1.275
        ([0, 0, 0], [0.3], 1.0),
    ],
)
def test_e_accept_known_values(
    deltas: list[float], grid: list[float] | None, expected: float
) -> None:
    assert e_accept(deltas, grid) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("wins", "losses", "p1", "grid", "expected"),
    [
        (0, 0, 0.6, None, 1.0),
        (0, 1, 0.6, [0.5], 1.75),  # 1 + 0.5 * 0.6 / 0.4
        (1, 0, 0.6, [0.5], 0.5),
        (1, 2, 0.75, [0.2, 0.4], (0.8 * 1.6**2 + 0.6 * 2.2**2) / 2),  # 2.476
        (0, 1, 0.6, None, 1 + 1.5 * sum(DEFAULT_FUTILITY_GRID) / len(DEFAULT_FUTILITY_GRID)),
    ],
)
def test_e_futility_known_values(
    wins: int, losses: int, p1: float, grid: list[float] | None, expected: float
) -> None:
    assert e_futility(wins, losses, p1, grid) == pytest.approx(expected, rel=1e-12)


def test_huge_evidence_saturates_instead_of_overflowing() -> None:
    assert e_accept([1.0] * 5000, [0.5]) == math.inf
    assert e_futility(0, 5000, 0.9, [0.5]) == math.inf


@pytest.mark.parametrize(
    ("deltas", "grid"),
    [
        ([math.nan], None),
        ([math.inf], None),
        ([1.5], None),
        ([-1.01], None),
        (["0.5"], None),
        ([True], None),
        ([0.5], []),
        ([0.5], [0.0]),
        ([0.5], [0.51]),
        ([0.5], [math.nan]),
        ([0.5], [-0.1]),
    ],
)
def test_e_accept_refuses_bad_input(deltas: list[object], grid: list[float] | None) -> None:
    with pytest.raises(GateInputError):
        e_accept(deltas, grid)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("wins", "losses", "p1", "grid"),
    [
        (-1, 0, 0.6, None),
        (0, -1, 0.6, None),
        (1.0, 0, 0.6, None),
        (True, 0, 0.6, None),
        (0, 0, 0.5, None),
        (0, 0, 1.0, None),
        (0, 0, 0.4, None),
        (0, 0, math.nan, None),
        (0, 0, 0.6, [0.7]),
        (0, 0, 0.6, []),
    ],
)
def test_e_futility_refuses_bad_input(
    wins: object, losses: object, p1: object, grid: list[float] | None
) -> None:
    with pytest.raises(GateInputError):
        e_futility(wins, losses, p1, grid)  # type: ignore[arg-type]


unit_delta = st.fractions(min_value=-1, max_value=1, max_denominator=6).map(float)


@given(st.lists(unit_delta, max_size=60), st.randoms(use_true_random=False))
def test_e_accept_is_exactly_order_invariant(deltas: list[float], rnd: random.Random) -> None:
    shuffled = list(deltas)
    rnd.shuffle(shuffled)
    assert e_accept(shuffled) == e_accept(deltas)


@given(st.lists(unit_delta, max_size=40), st.lists(unit_delta, max_size=40))
def test_e_accept_factorises_over_a_single_bet(a: list[float], b: list[float]) -> None:
    grid = [0.3]
    assert e_accept(a + b, grid) == pytest.approx(e_accept(a, grid) * e_accept(b, grid), rel=1e-9)


def _binomial_mean(n: int, p: float, value: Callable[[int, int], float]) -> float:
    return math.fsum(
        math.comb(n, w) * p**w * (1 - p) ** (n - w) * value(w, n - w) for w in range(n + 1)
    )


@pytest.mark.parametrize("p1", [0.55, 0.6, 0.75])
@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_e_futility_has_mean_one_at_p1_and_below_one_above(p1: float, n: int) -> None:
    at_p1 = _binomial_mean(n, p1, lambda w, lo: e_futility(w, lo, p1))
    above = _binomial_mean(n, min(p1 + 0.1, 0.99), lambda w, lo: e_futility(w, lo, p1))
    assert at_p1 == pytest.approx(1.0, abs=1e-12)
    assert above < 1.0


@pytest.mark.parametrize("n", [1, 3, 8])
def test_e_accept_has_mean_one_when_candidate_equals_baseline(n: int) -> None:
    # D in {-1, 0, +1} with P(+1) = P(-1) = 0.3: E[D] = 0, so E[E+] must be exactly 1.
    probs = {-1.0: 0.3, 0.0: 0.4, 1.0: 0.3}
    total = 0.0
    for idx in range(3**n):
        seq = [(-1.0, 0.0, 1.0)[(idx // 3**i) % 3] for i in range(n)]
        total += math.prod(probs[d] for d in seq) * e_accept(seq)
    assert total == pytest.approx(1.0, abs=1e-12)


def _crossing_probability(steps: int, p_win: float, crosses: Callable[[int, int], bool]) -> float:
    """P(the process crosses within `steps` discordant pairs), exactly, by DP over (W, L)."""
    crosses = functools.cache(crosses)
    alive = {(0, 0): 1.0}
    crossed = 0.0
    for _ in range(steps):
        nxt: dict[tuple[int, int], float] = {}
        for (w, lo), pr in alive.items():
            for state, q in (((w + 1, lo), p_win), ((w, lo + 1), 1 - p_win)):
                if crosses(*state):
                    crossed += pr * q
                else:
                    nxt[state] = nxt.get(state, 0.0) + pr * q
        alive = nxt
    return crossed


def test_accept_anytime_type_one_error_is_at_most_alpha_exactly() -> None:
    # Checking after every single pair, for 200 pairs, at P(W) = .5 (the boundary of H0).
    p = _crossing_probability(200, 0.5, lambda w, lo: e_accept([1.0] * w + [-1.0] * lo) >= 20)
    assert 0.0 < p <= 0.05


def test_futility_anytime_error_is_at_most_beta_exactly() -> None:
    # Checking after every pair, for 200 pairs, at P(W) = p1 = .6 (the boundary of H0').
    p = _crossing_probability(200, 0.6, lambda w, lo: e_futility(w, lo, 0.6) >= 5)
    assert 0.0 < p <= 0.2


def test_a_fixed_n_test_peeking_every_pair_would_fail_the_same_check() -> None:
    # The exact DP is sharp enough to see the error a naive rule makes: a one-sided z-test
    # at 1.645 re-run after every pair crosses far more often than 5% within 200 pairs.
    def naive(w: int, lo: int) -> bool:
        n = w + lo
        return n >= 10 and (w - lo) / math.sqrt(n) >= 1.645

    assert _crossing_probability(200, 0.5, naive) > 0.15
