"""The INFRA guard's sequential tests (issue 19 points 2 and 3): they trip exactly when an
independently computed e-value reaches 1/alpha, in exact arithmetic at and around every boundary,
and meet their targets on seeded simulations (the full table is bench/gate_oc.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trm_gate import GateConfig, GateInputError
from trm_gate.guard import GUARD_BETS, exact, infra_violation

BETS = (Fraction(1, 4), Fraction(1, 2), Fraction(3, 4))


def reference_e(values: list[int], null_mean: Fraction, floor: int) -> Fraction:
    """mean over c of prod_i (1 + c (y_i - mu0) / (mu0 - floor)), unit by unit."""
    total = Fraction(0)
    for c in BETS:
        wealth = Fraction(1)
        for y in values:
            wealth *= 1 + c * (y - null_mean) / (null_mean - floor)
        total += wealth
    return total / len(BETS)


def indicators(units: int, ib: int, ic: int, both: int) -> tuple[list[int], list[int]]:
    """Per-unit INFRA indicators (baseline, candidate) with these counts."""
    base = [1] * both + [1] * (ib - both) + [0] * (units - ib)
    cand = [1] * both + [0] * (ib - both) + [1] * (ic - both) + [0] * (units - ib - ic + both)
    return base, cand


def guard(units: int, ib: int, ic: int, both: int, **kw: object) -> str | None:
    params: dict[str, object] = {"max_rate": Fraction(1, 5), "margin": 0, "alpha": Fraction(1, 20)}
    params.update(kw)
    return infra_violation(
        units=units,
        infra_baseline=ib,
        infra_candidate=ic,
        infra_both=both,
        min_units=1,
        **params,  # type: ignore[arg-type]
    )


def test_the_guard_bets_are_the_ones_this_reference_uses() -> None:
    assert GUARD_BETS == BETS


@st.composite
def counts(draw: st.DrawFn) -> tuple[int, int, int, int]:
    units = draw(st.integers(1, 80))
    ib = draw(st.integers(0, units))
    ic = draw(st.integers(0, units))
    both = draw(st.integers(max(0, ib + ic - units), min(ib, ic)))
    return units, ib, ic, both


@settings(max_examples=300, deadline=None)
@given(
    counts(),
    st.fractions(Fraction(1, 50), Fraction(49, 50)),
    st.fractions(Fraction(0), Fraction(1, 2)),
    st.fractions(Fraction(1, 1000), Fraction(1, 2)),
)
def test_the_guard_trips_exactly_when_an_e_value_reaches_one_over_alpha(
    c: tuple[int, int, int, int], rate: Fraction, margin: Fraction, alpha: Fraction
) -> None:
    units, ib, ic, both = c
    base, cand = indicators(units, ib, ic, both)
    e_values = [
        reference_e(base, rate, 0),
        reference_e(cand, rate, 0),
        reference_e([y - x for x, y in zip(base, cand, strict=True)], margin, -1),
    ]
    why = guard(units, ib, ic, both, max_rate=rate, margin=margin, alpha=alpha)
    assert (why is not None) == any(e >= 1 / alpha for e in e_values)


def test_at_the_exact_boundary_the_guard_trips_and_just_below_it_does_not() -> None:
    # Candidate-only INFRA on 7 of 20 units, margin 0: E = mean(1.25^7, 1.5^7, 1.75^7) exactly.
    e = reference_e([1] * 7 + [0] * 13, Fraction(0), -1)
    assert guard(20, 0, 7, 0, max_rate=1, alpha=1 / e) is not None  # E = 1/alpha: trips
    nearly = 1 / e - Fraction(1, 10**40)  # 1/alpha one hair above E: floats cannot see it
    assert float(nearly) == float(1 / e)
    assert guard(20, 0, 7, 0, max_rate=1, alpha=nearly) is None
    assert guard(20, 0, 6, 0, max_rate=1, alpha=1 / e) is None  # one unit fewer
    # The absolute rule at its own exact boundary: 9 of 17 at rate 1/5.
    e_abs = reference_e([1] * 9 + [0] * 8, Fraction(1, 5), 0)
    assert guard(17, 0, 9, 0, margin=Fraction(99, 100), alpha=1 / e_abs) is not None
    assert (
        guard(17, 0, 9, 0, margin=Fraction(99, 100), alpha=1 / e_abs - Fraction(1, 10**40)) is None
    )


def test_at_exactly_the_margin_the_relative_rule_does_not_trip() -> None:
    # The case: baseline 11/120, candidate 23/120, infra_max_rate .2 and the old margin
    # (.1 = 10 points): "more than 10 points above" is false. The old float rule tripped here.
    assert guard(120, 11, 23, 11, max_rate=0.2, margin=0.1, alpha=0.05) is None
    assert guard(120, 11, 23, 0, max_rate=0.2, margin=0.1, alpha=0.05) is None
    # Around it: a real excess over the margin trips, and the same data against margin 0 trips.
    assert guard(120, 0, 40, 0, max_rate=0.5, margin=0.1, alpha=0.05) is not None
    assert guard(120, 11, 23, 11, max_rate=0.2, margin=0, alpha=0.05) is not None


def test_rates_are_read_exactly() -> None:
    assert exact("r", 0.2) == Fraction(1, 5)
    assert exact("r", 0.1) + exact("r", 0.2) == exact("r", 0.3)  # unlike 0.1 + 0.2 as floats
    assert exact("r", 1) == 1 and exact("r", Fraction(1, 3)) == Fraction(1, 3)
    for bad in (math.nan, math.inf, "0.2", True, None):
        with pytest.raises(GateInputError):
            exact("r", bad)


def test_edges_of_the_rates() -> None:
    # Rate 0: one INFRA unit refutes "never INFRA"; rate 1: nothing can exceed it.
    assert "baseline" in (guard(10, 1, 1, 1, max_rate=0) or "")
    assert guard(10, 0, 0, 0, max_rate=0) is None
    assert guard(10, 10, 10, 10, max_rate=1) is None
    assert guard(10, 0, 10, 0, max_rate=1, margin=Fraction(999, 1000)) is None


def test_min_units_is_a_burn_in() -> None:
    kw: dict[str, object] = {"max_rate": 0.2, "margin": 0, "alpha": 0.05}
    args = {"infra_baseline": 0, "infra_candidate": 12, "infra_both": 0}
    assert infra_violation(units=14, min_units=15, **args, **kw) is None  # type: ignore[arg-type]
    assert infra_violation(units=15, min_units=15, **args, **kw) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(("ib", "ic", "both"), [(3, 0, 1), (8, 8, 5), (-1, 0, 0), (11, 0, 0)])
def test_inconsistent_counts_are_refused(ib: int, ic: int, both: int) -> None:
    with pytest.raises(GateInputError, match="inconsistent"):
        guard(10, ib, ic, both)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"infra_margin": 1.0},
        {"infra_margin": -0.1},
        {"infra_alpha": 0.0},
        {"infra_alpha": 1.0},
        {"infra_max_rate": math.inf},
        {"infra_policy": "ignore"},
        {"infra_reasons": "error"},
        {"infra_reasons": frozenset({"timeout"})},
    ],
)
def test_bad_guard_parameters_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(GateInputError):
        GateConfig(**kwargs)  # type: ignore[arg-type]


def simulate(
    rng: np.random.Generator, reps: int, rate_b: float, rate_c: float, units: int, block: int
) -> list[int | None]:
    """Per replication: the units after which the default guard trips, or None."""
    cfg = GateConfig()
    max_rate, margin, alpha = cfg.guard_rates
    out: list[int | None] = []
    for _ in range(reps):
        ib_i = rng.random(units) < rate_b
        ic_i = rng.random(units) < rate_c
        tripped = None
        for n in range(block, units + 1, block):
            b, c = ib_i[:n], ic_i[:n]
            why = infra_violation(
                units=n,
                infra_baseline=int(b.sum()),
                infra_candidate=int(c.sum()),
                infra_both=int((b & c).sum()),
                max_rate=max_rate,
                margin=margin,
                alpha=alpha,
                min_units=cfg.infra_min_units,
            )
            if why is not None:
                tripped = n
                break
        out.append(tripped)
    return out


def test_equal_random_infra_rarely_trips_the_guard() -> None:
    # 10% in both arms, 400 units in blocks of 20 (a long gate): false infra_abort <= 5%
    # (bound + 3 s.e. at 600 replications). The old running-proportion rule: 18-23%.
    trips = simulate(np.random.default_rng(19), 600, 0.1, 0.1, 400, 20)
    assert sum(t is not None for t in trips) / len(trips) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 600)


def test_a_candidate_at_20_percent_against_0_trips_within_three_blocks() -> None:
    trips = simulate(np.random.default_rng(20), 600, 0.0, 0.2, 60, 20)
    assert sum(t is not None for t in trips) / len(trips) >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / 600)
