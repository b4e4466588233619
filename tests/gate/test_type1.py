"""Regression check on the accept type-I bound, by a small seeded simulation (the full
operating-characteristics table is bench/gate_oc.py).

Each simulated unit is one question per arm at P(W) = .5 among discordant pairs (the boundary
of H0), with half the units ties; blocks of 20 units; the gate looks after every block. With
1,000 replications the Monte-Carlo standard error of a rate near alpha is
sqrt(alpha (1 - alpha) / 1000) ~ .0069, so the assertion is rate <= alpha + 3 s.e. (~ .071):
it catches a broken bound (a peeking fixed-n test runs at .12-.27 here), not a small excess.

The last check is bench/gate_oc.py's `dep30` row (issue 19): the candidate INFRA on 30% of the
units it would have lost. It runs the bench's own simulation, on a 300-unit pool to stay fast.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from bench.gate_oc import Scenario, blocks_of, simulate_units
from trm_gate import BlockPairing, GateConfig, run_blocks

REPS = 1000
BLOCK = 20


def blocks(rng: np.random.Generator) -> Iterator[BlockPairing]:
    while True:
        tie = rng.random(BLOCK) < 0.5
        win = rng.random(BLOCK) < 0.5
        deltas = tuple(0.0 if t else (1.0 if w else -1.0) for t, w in zip(tie, win, strict=True))
        yield BlockPairing(units=BLOCK, deltas=deltas, infra_baseline=0, infra_candidate=0)


def false_accept_rate(config: GateConfig, seed: int) -> float:
    rng = np.random.default_rng(seed)
    verdicts = [run_blocks(config, blocks(rng)).verdict for _ in range(REPS)]
    return verdicts.count("accept") / REPS


def bound(alpha: float) -> float:
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / REPS)


def test_gate_false_accept_rate_is_within_alpha() -> None:
    config = GateConfig(max_pairs=400)
    assert false_accept_rate(config, seed=11) <= bound(config.alpha)


def test_accept_process_alone_keeps_alpha_under_long_monitoring() -> None:
    # Futility practically off (1/beta = 1e9), so only the accept e-process and the cap stop
    # the gate: up to 1,000 discordant pairs (~100 looks) at the boundary of H0.
    config = GateConfig(beta=1e-9, max_pairs=1000)
    assert false_accept_rate(config, seed=12) <= bound(config.alpha)


def test_infra_on_the_candidates_losses_keeps_alpha_under_the_bounded_policy() -> None:
    rng = np.random.default_rng(13)
    outcomes = simulate_units(rng, REPS, 300, Scenario("dep30", 0.5, on_losses=0.3), 0.5)
    verdicts = {"bounded": [], "exclude": []}
    for policy, seen in verdicts.items():
        config = GateConfig(max_pairs=400, infra_policy=policy)  # type: ignore[arg-type]
        seen += [run_blocks(config, blocks_of(outcomes, i, BLOCK)).verdict for i in range(REPS)]
    assert verdicts["bounded"].count("accept") / REPS <= bound(0.05)
    # The same data under "exclude" (the old procedure): above alpha, so the check can fail.
    assert verdicts["exclude"].count("accept") / REPS > 0.05
