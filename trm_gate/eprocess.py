"""The two e-processes of the gate (testing by betting); pure functions, no I/O.

Accept — H0: the candidate is no better, E[D_i | past] <= 0, with D_i = candidate score -
baseline score in [-1, 1] for each paired non-INFRA unit. For a bet l in (0, 1/2] the wealth
prod_i (1 + l D_i) is a product of factors >= 1/2 whose conditional mean is
1 + l E[D_i | past] <= 1, so it is a nonnegative supermartingale starting at 1; so is the
fixed-weight mixture E+ = mean_k prod_i (1 + l_k D_i). Ville's inequality gives
P(sup_n E+_n >= 1/alpha) <= alpha: checking after every block (or every pair) keeps the type-I
error at alpha. Capping bets at 1/2 means one loss can at most halve a bet's wealth.

Futility — H0': P(W) >= p1 over discordant pairs, X_i = 1 for a win, 0 for a loss. The factor
f_l(X) = 1 + l (p1 - X) / (1 - p1), l in (0, 1/2], is 1 - l after a win and
1 + l p1 / (1 - p1) after a loss, so it is positive and E[f_l | P(W) = p] =
1 + l (p1 - p) / (1 - p1) <= 1 whenever p >= p1. (It is the likelihood ratio of
Bernoulli(q = p1 (1 - l)) against Bernoulli(p1).) Hence
E- = mean_k (1 - l_k)^W (1 + l_k p1 / (1 - p1))^L is a nonnegative supermartingale under H0',
and P(sup E- >= 1/beta) <= beta: a candidate whose win rate is at least p1 is wrongly called
futile with probability at most beta.

INFRA units. Under the "bounded" policy (`trm_gate.pairing`) an INFRA unit enters E+ with
D' = (c or 0) - (b or 1) and E- with D'' = (c or 1) - (b or 0), the unknown score replaced by its
worst case. Whatever the unit's true D (had the infrastructure not failed), D' <= D <= D''. The
accept factor 1 + l D is increasing in D and the futility factor (1 - l on a win, 1 on a tie,
1 + l p1 / (1 - p1) on a loss) is nonincreasing, so unit by unit each bounded factor is at most the
factor on the true outcome, and the bounded wealth is at most the wealth on the true outcomes at
every time. The latter is the nonnegative supermartingale above (under H0, resp. H0'), so
P(sup bounded >= 1/alpha) <= P(sup true >= 1/alpha) <= alpha, with no assumption on what causes
INFRA: it may depend on the outcomes, the unit, the past. Under "exclude" INFRA units are skipped,
which keeps the supermartingale only when whether a unit is INFRA is independent of its outcome.

Both depend on the data only through the multiset of deltas (or the W/L counts), and sums are
taken with `math.fsum` (exactly rounded), so the values are exactly order-invariant: units
evaluated in parallel inside a block need no ordering. Default grids were tuned with
`bench/gate_oc.py` (alpha .05, beta .2, p1 .6, blocks of 20 units).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from trm_gate._checks import check_count, check_open_interval, check_real
from trm_gate.errors import GateInputError

__all__ = [
    "DEFAULT_ACCEPT_GRID",
    "DEFAULT_FUTILITY_GRID",
    "DeltaCounts",
    "check_grid",
    "check_p1",
    "count_deltas",
    "e_accept",
    "e_futility",
    "log_e_accept",
    "log_e_futility",
    "merge_counts",
    "to_e_value",
]

DEFAULT_ACCEPT_GRID: tuple[float, ...] = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
DEFAULT_FUTILITY_GRID: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)

DeltaCounts = tuple[tuple[float, int], ...]
"""Nonzero deltas and how often each occurred, sorted by value (ties add nothing to E+)."""


def check_grid(grid: Iterable[float] | None, default: tuple[float, ...]) -> tuple[float, ...]:
    """A non-empty grid of bets, each in (0, 1/2]; None means `default`."""
    if grid is None:
        return default
    bets = tuple(grid)
    if not bets:
        raise GateInputError("the bet grid must not be empty")
    for bet in bets:
        if not 0.0 < check_real("bet", bet) <= 0.5:
            raise GateInputError(f"every bet must be in (0, 1/2], got {bet!r}")
    return tuple(float(b) for b in bets)


def check_p1(p1: object) -> float:
    """The futility alternative: a win rate strictly between 1/2 and 1."""
    return check_open_interval("p1", p1, 0.5, 1.0)


def count_deltas(deltas: Iterable[float]) -> Counter[float]:
    """Count the nonzero deltas, refusing anything outside [-1, 1] (NaN included)."""
    counts: Counter[float] = Counter()
    for d in deltas:
        x = check_real("delta", d)
        if not -1.0 <= x <= 1.0:
            raise GateInputError(f"a delta must be in [-1, 1], got {d!r}")
        if x != 0.0:
            counts[x] += 1
    return counts


def merge_counts(counts: DeltaCounts, more: Mapping[float, int]) -> DeltaCounts:
    """Add `more` to `counts`, keeping the canonical sorted form."""
    merged = Counter(dict(counts))
    merged.update(more)
    return tuple(sorted(merged.items()))


def _log_mean_exp(logs: list[float]) -> float:
    top = max(logs)
    return top + math.log(math.fsum(math.exp(x - top) for x in logs) / len(logs))


def log_e_accept(counts: DeltaCounts, grid: tuple[float, ...]) -> float:
    """log E+ from delta counts (arguments assumed valid: see `e_accept`)."""
    return _log_mean_exp([math.fsum(n * math.log1p(bet * d) for d, n in counts) for bet in grid])


def log_e_futility(wins: int, losses: int, p1: float, grid: tuple[float, ...]) -> float:
    """log E- from the W/L counts (arguments assumed valid: see `e_futility`)."""
    odds = p1 / (1.0 - p1)
    return _log_mean_exp(
        [wins * math.log1p(-bet) + losses * math.log1p(bet * odds) for bet in grid]
    )


def to_e_value(log_e: float) -> float:
    """An e-value from its logarithm (gates and events store log e-values): exp(log_e),
    saturating at +inf instead of raising OverflowError. The one such conversion in trm."""
    try:
        return math.exp(log_e)
    except OverflowError:
        return math.inf


def e_accept(deltas: Iterable[float], grid: Iterable[float] | None = None) -> float:
    """E+ = mean over the grid of prod_i (1 + l_k D_i); 1.0 for no deltas.

    Computed in log space; exactly invariant to the order of `deltas`.
    """
    bets = check_grid(grid, DEFAULT_ACCEPT_GRID)
    counts = tuple(sorted(count_deltas(deltas).items()))
    return to_e_value(log_e_accept(counts, bets))


def e_futility(wins: int, losses: int, p1: float, grid: Iterable[float] | None = None) -> float:
    """E- = mean over the grid of (1 - l_k)^W (1 + l_k p1 / (1 - p1))^L, against P(W) >= p1.

    Grows with losses, shrinks with wins; an e-value under H0' (its mean is <= 1 there).
    """
    w = check_count("wins", wins)
    lo = check_count("losses", losses)
    return to_e_value(log_e_futility(w, lo, check_p1(p1), check_grid(grid, DEFAULT_FUTILITY_GRID)))
