"""The INFRA guard: end the gate when too much of the evidence is infrastructure failure.

INFRA units are excluded from pairing, which is right when failures strike both arms alike and
wrong when they do not: a candidate that breaks the parser on exactly its hard units would have
its losses quietly dropped. The guard bounds both cases. Per arm, with k INFRA units among n
units evaluated *now* (baseline cache hits were evaluated earlier and say nothing about the
current infrastructure, so they are in neither k nor n):

1. absolute: once n >= `min_units`, k / n > `max_rate` trips it (for either arm);
2. relative ("well above"): once the candidate has n_c >= `min_units`, a candidate rate
   k_c / n_c above the baseline's k_b / n_b (0 when every baseline unit came from the cache)
   by more than `max_rate` x RELATIVE_MARGIN trips it. With the defaults (0.2, 0.5) that is a
   candidate INFRA rate more than 10 percentage points above the baseline's.

It is a pure function of the cumulative counts; the gate calls it after pairing a block and
before writing that block's baseline outcomes to the cache, so a tripped block caches nothing.
"""

from __future__ import annotations

__all__ = ["RELATIVE_MARGIN", "infra_violation"]

RELATIVE_MARGIN = 0.5
"""The candidate may exceed the baseline's INFRA rate by max_rate x this before the guard trips."""


def infra_violation(
    *,
    infra_baseline: int,
    baseline_evaluated: int,
    infra_candidate: int,
    candidate_evaluated: int,
    max_rate: float,
    min_units: int,
) -> str | None:
    """Why the guard trips for these cumulative counts, or None when it does not."""
    for arm, k, n in (
        ("baseline", infra_baseline, baseline_evaluated),
        ("candidate", infra_candidate, candidate_evaluated),
    ):
        if n >= min_units and k / n > max_rate:
            return f"{arm} INFRA rate {k}/{n} = {k / n:.3f} exceeds infra_max_rate {max_rate:g}"
    if candidate_evaluated >= min_units:
        rate_c = infra_candidate / candidate_evaluated
        rate_b = infra_baseline / baseline_evaluated if baseline_evaluated else 0.0
        margin = max_rate * RELATIVE_MARGIN
        if rate_c > rate_b + margin:
            return (
                f"candidate INFRA rate {rate_c:.3f} is more than {margin:g} above the "
                f"baseline's {rate_b:.3f}"
            )
    return None
