"""The INFRA guard: anytime-valid sequential tests on the units' INFRA indicators.

Unit i of the gate (every unit of the blocks so far) has an INFRA indicator per arm, I_b and
I_c in {0, 1}: 1 when a question of the unit ended with a stop reason in the gate's
`infra_reasons` (a documented parameter of `Gate`, `GateConfig` and `GateSettings`; by default
`{error, parse_error}`, the original plan's rule), so the guard and the e-processes always agree
on which units are INFRA. A baseline unit taken from the cache counts as evaluated and not
INFRA: it was evaluated in an earlier gate and only non-INFRA outcomes are ever cached. Two
rules, each a test by betting whose e-value must reach 1/`alpha` (`infra_alpha`) to trip the guard:

1. absolute, per arm: H0 "the arm's INFRA rate is at most r" (`infra_max_rate`), with
   E = mean_k prod_i (1 + l_k (I_i - r)), l_k = c_k / r;
2. relative, paired by unit: H0 "the candidate's INFRA rate exceeds the baseline's by at most
   m" (`infra_margin`), with D_i = I_c - I_b in {-1, 0, 1} and
   E = mean_k prod_i (1 + l_k (D_i - m)), l_k = c_k / (1 + m).

With c_k in GUARD_BETS (0 < c_k < 1) every factor is positive, and its conditional mean is
1 + l_k (E[I_i | past] - r) <= 1 under H0 (likewise for D_i), so each E is a nonnegative
supermartingale starting at 1 and, by Ville's inequality, trips with probability at most
`alpha` under its H0 however often it is checked; noise at equal rates therefore does not trip
the relative rule, while a real excess makes its E grow geometrically. The rules are checked
once the gate has `min_units` units (a burn-in cannot hurt validity) and before a block's
baseline outcomes are cached, so a tripped block caches nothing.

Everything is exact: rates are `Fraction`s (a float is read as the decimal it prints as, so 0.2
is 1/5) and the e-values are products of rationals compared with 1/alpha as rationals.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

from trm_gate.errors import GateInputError

__all__ = ["GUARD_BETS", "exact", "infra_violation"]

GUARD_BETS: tuple[Fraction, ...] = (Fraction(1, 4), Fraction(1, 2), Fraction(3, 4))
"""The fractions c_k of the largest bet that keeps every factor nonnegative."""

Rate = Fraction | float | int


def exact(name: str, value: object) -> Fraction:
    """`value` as a Fraction: ints and Fractions as they are, a float as the decimal it prints as
    (so 0.2 is exactly 1/5, not the binary double nearest to it)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise GateInputError(f"{name} must be a real number, got {value!r}")
    if isinstance(value, float):
        try:
            return Fraction(repr(value))
        except ValueError as e:  # nan, inf
            raise GateInputError(f"{name} must be finite, got {value!r}") from e
    return Fraction(value)


@lru_cache(maxsize=4096)
def _reaches(
    counts: tuple[tuple[Fraction, int], ...], null_mean: Fraction, floor: Fraction, alpha: Fraction
) -> float | None:
    """The e-value against H0 "mean <= null_mean" of a variable >= floor, from how often each
    value occurred, if it reaches 1/alpha (compared exactly); None if it does not."""
    span = null_mean - floor
    if span == 0:  # H0 pins the variable at its floor: one value above it refutes H0
        return math.inf if any(n for v, n in counts if v > floor) else None
    total = Fraction(0)
    for c in GUARD_BETS:
        wealth = Fraction(1)
        for value, n in counts:
            wealth *= (1 + c * (value - null_mean) / span) ** n
        total += wealth
    e_value = total / len(GUARD_BETS)
    if e_value * alpha < 1:
        return None
    try:
        return float(e_value)
    except OverflowError:
        return math.inf


def infra_violation(
    *,
    units: int,
    infra_baseline: int,
    infra_candidate: int,
    infra_both: int,
    max_rate: Rate,
    margin: Rate,
    alpha: Rate,
    min_units: int,
) -> str | None:
    """Why the guard trips after `units` units with these INFRA counts, or None.

    `infra_both` counts the units INFRA in both arms (so the candidate-only units are
    infra_candidate - infra_both, the baseline-only ones infra_baseline - infra_both).
    """
    if not (
        0 <= infra_both <= min(infra_baseline, infra_candidate)
        and infra_baseline + infra_candidate - infra_both <= units
    ):
        raise GateInputError(
            f"inconsistent INFRA counts: {infra_baseline} baseline, {infra_candidate} "
            f"candidate, {infra_both} both, of {units} units"
        )
    if units < min_units:
        return None
    r, m, a = exact("max_rate", max_rate), exact("margin", margin), exact("alpha", alpha)
    zero, one = Fraction(0), Fraction(1)
    for arm, k in (("baseline", infra_baseline), ("candidate", infra_candidate)):
        e = _reaches(((one, k), (zero, units - k)), r, zero, a)
        if e is not None:
            return (
                f"{arm} INFRA rate {k}/{units} exceeds infra_max_rate {r}: e-value "
                f"{e:.4g} >= 1/infra_alpha = {float(1 / a):g}"
            )
    only_c, only_b = infra_candidate - infra_both, infra_baseline - infra_both
    e = _reaches(((one, only_c), (-one, only_b), (zero, units - only_c - only_b)), m, -one, a)
    if e is not None:
        return (
            f"candidate INFRA rate {infra_candidate}/{units} is more than {m} above the "
            f"baseline's {infra_baseline}/{units} (paired by unit: {only_c} candidate-only, "
            f"{only_b} baseline-only): e-value {e:.4g} >= 1/infra_alpha = {float(1 / a):g}"
        )
    return None
