"""Operating characteristics of trm_gate's sequential gate, by seeded simulation.

Runs the shipped pure core (`trm_gate.run_blocks`, default bet grids) on simulated outcomes and
prints, per true win rate P(W): P(accept), P(reject), P(inconclusive), E[discordant pairs] and
E[units]. References measured in the same run on the same simulated data:
  * a fixed-n one-sided sign test (alpha .05) re-run after every block ("peeking"), whose false
    accept rate at P(W) = .5 is what the gate's anytime-valid guarantee avoids;
  * the fixed sample size a one-sided sign test needs for power .8 at P(W) = .6, against which
    the gate's E[discordant pairs] is given as a ratio.

A simulated unit is one question per arm: with probability `--tie-rate` the arms agree (a tie,
no signal), otherwise the pair is discordant and the candidate wins with probability P(W). So
D is in {-1, 0, +1}; with the default tie rate .5 a block of 20 units holds about 10 discordant
pairs, i.e. the gate looks about every 10 pairs. No INFRA units are simulated (they are
excluded from the statistics by construction; tests/gate covers that).

Usage: python bench/gate_oc.py [--reps 10000] [--seed 20240605] [--tie-rate 0.5]
                               [--block-size 20] [--max-pairs 400] [--pool-units 4000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trm_gate import BlockPairing, GateConfig, run_blocks

WIN_RATES = (0.5, 0.55, 0.6, 0.65, 0.7)
ANCHOR_EN = {0.6: 171, 0.65: 75, 0.7: 43}  # SPEC section 3, discordant pairs
SIGN_TEST_HORIZONS = (100, 400, 1000)  # discordant pairs over which the peeking test runs
CHUNK = 500  # replications generated at once (bounds memory)

Outcomes = npt.NDArray[np.int8]


@dataclass
class Row:
    """Operating characteristics at one win rate."""

    p: float
    accept: float
    reject: float
    inconclusive: float
    mean_pairs: float
    mean_units: float


def simulate_outcomes(
    rng: np.random.Generator, reps: int, p: float, tie_rate: float, units: int
) -> Outcomes:
    """reps x units matrix of D in {-1, 0, +1}."""
    discordant = rng.random((reps, units)) >= tie_rate
    win = rng.random((reps, units)) < p
    return np.where(discordant, np.where(win, 1, -1), 0).astype(np.int8)


def blocks_of(row: Outcomes, block_size: int) -> Iterator[BlockPairing]:
    """One replication's units, cut into blocks (the last may be short)."""
    for start in range(0, row.shape[0], block_size):
        deltas = tuple(map(float, row[start : start + block_size].tolist()))
        yield BlockPairing(units=len(deltas), deltas=deltas, infra_baseline=0, infra_candidate=0)


def run_gate(outcomes: Outcomes, config: GateConfig) -> tuple[list[str], list[int], list[int]]:
    """Verdict, discordant pairs and units used, per replication."""
    verdicts, pairs, units = [], [], []
    for row in outcomes:
        state = run_blocks(config, blocks_of(row, config.block_size))
        verdicts.append(str(state.verdict))
        pairs.append(state.discordant)
        units.append(state.units)
    return verdicts, pairs, units


def sign_test_critical(n_max: int, alpha: float) -> npt.NDArray[np.int64]:
    """crit[n] = smallest w with P(Bin(n, 1/2) >= w) <= alpha (n + 1 if none)."""
    crit = np.empty(n_max + 1, dtype=np.int64)
    for n in range(n_max + 1):
        tail, w = 0.0, n + 1
        while w > 0 and tail + math.comb(n, w - 1) / 2.0**n <= alpha:
            w -= 1
            tail += math.comb(n, w) / 2.0**n
        crit[n] = w
    return crit


def peeking_sign_test(
    outcomes: Outcomes, block_size: int, horizon: int, crit: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Did a fixed-n sign test, re-run after every block, ever reject H0 within `horizon`?"""
    n_blocks = outcomes.shape[1] // block_size
    blocked = outcomes[:, : n_blocks * block_size].reshape(outcomes.shape[0], n_blocks, block_size)
    wins = np.cumsum((blocked > 0).sum(axis=2), axis=1)
    pairs = np.cumsum((blocked != 0).sum(axis=2), axis=1)
    looked = (pairs > 0) & (pairs <= horizon)
    rejected: npt.NDArray[np.bool_] = np.any(
        looked & (wins >= crit[np.minimum(pairs, crit.shape[0] - 1)]), axis=1
    )
    return rejected


def fixed_n_for_power(alpha: float, p: float, power: float) -> int:
    """Smallest n at which the one-sided exact sign test has `power` at P(W) = p."""
    n = 1
    while True:
        crit = int(sign_test_critical(n, alpha)[n])
        hit = sum(math.comb(n, w) * p**w * (1 - p) ** (n - w) for w in range(crit, n + 1))
        if hit >= power:
            return n
        n += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20240605)
    parser.add_argument("--tie-rate", type=float, default=0.5)
    parser.add_argument("--block-size", type=int, default=20)
    parser.add_argument("--max-pairs", type=int, default=400)
    parser.add_argument("--pool-units", type=int, default=4000)
    args = parser.parse_args()
    config = GateConfig(block_size=args.block_size, max_pairs=args.max_pairs)
    rng = np.random.default_rng(args.seed)
    crit = sign_test_critical(max(SIGN_TEST_HORIZONS), config.alpha)
    print(
        f"trm_gate OC: {args.reps} replications/row, seed {args.seed}, alpha {config.alpha}, "
        f"beta {config.beta}, p1 {config.p1}, block {config.block_size} units, tie rate "
        f"{args.tie_rate}, max_pairs {config.max_pairs}, pool {args.pool_units} units"
    )
    print(f"accept grid {config.accept_grid}; futility grid {config.futility_grid}")
    started = time.perf_counter()
    rows: list[Row] = []
    peeking: dict[int, float] = {}
    for p in WIN_RATES:
        verdicts: list[str] = []
        pairs: list[int] = []
        units: list[int] = []
        peek_hits = {h: 0 for h in SIGN_TEST_HORIZONS}
        for done in range(0, args.reps, CHUNK):
            n = min(CHUNK, args.reps - done)
            outcomes = simulate_outcomes(rng, n, p, args.tie_rate, args.pool_units)
            v, pr, u = run_gate(outcomes, config)
            verdicts += v
            pairs += pr
            units += u
            if p == 0.5:
                for h in SIGN_TEST_HORIZONS:
                    hits = peeking_sign_test(outcomes, config.block_size, h, crit)
                    peek_hits[h] += int(hits.sum())
        if p == 0.5:
            peeking = {h: k / args.reps for h, k in peek_hits.items()}
        rows.append(
            Row(
                p=p,
                accept=verdicts.count("accept") / args.reps,
                reject=verdicts.count("reject") / args.reps,
                inconclusive=verdicts.count("inconclusive") / args.reps,
                mean_pairs=float(np.mean(pairs)),
                mean_units=float(np.mean(units)),
            )
        )
    elapsed = time.perf_counter() - started
    report(rows, peeking, config, args.reps, elapsed)


def report(
    rows: list[Row], peeking: dict[int, float], config: GateConfig, reps: int, elapsed: float
) -> None:
    """Print the table, the references and the target checks."""
    n_fixed = fixed_n_for_power(config.alpha, 0.6, 0.8)
    print()
    print("P(W)   P(accept)  P(reject)  P(inconcl.)  E[disc. pairs]  E[units]  anchor E[N]")
    for r in rows:
        anchor = ANCHOR_EN.get(r.p)
        print(
            f"{r.p:<6} {r.accept:>9.4f}  {r.reject:>9.4f}  {r.inconclusive:>11.4f}  "
            f"{r.mean_pairs:>14.1f}  {r.mean_units:>8.1f}  {anchor if anchor else '-':>11}"
        )
    by_p = {r.p: r for r in rows}
    se = math.sqrt(config.alpha * (1 - config.alpha) / reps)
    print()
    print(f"reference: fixed-n sign test (one-sided, alpha {config.alpha}) re-run every block:")
    for h, rate in peeking.items():
        print(
            f"  false accept at P(W)=.5 within {h:>4} discordant pairs: {rate:.4f}"
            f"  (gate: {by_p[0.5].accept:.4f}, ratio gate/peeking {by_p[0.5].accept / rate:.2f})"
        )
    print(
        f"reference: fixed-n sign test with power .8 at P(W)=.6 needs n = {n_fixed} pairs; "
        f"gate E[pairs] at .6 / .65 / .7 = "
        + " / ".join(f"{by_p[p].mean_pairs / n_fixed:.2f}" for p in (0.6, 0.65, 0.7))
        + " x that n"
    )
    print()
    checks = [
        (
            "P(accept) at P(W)=.5 <= alpha",
            by_p[0.5].accept <= config.alpha,
            f"{by_p[0.5].accept:.4f} (MC s.e. <= {se:.4f})",
        ),
        ("power at P(W)=.6 >= .75", by_p[0.6].accept >= 0.75, f"{by_p[0.6].accept:.4f}"),
        (
            "E[disc. pairs] at P(W)=.65 <= 90",
            by_p[0.65].mean_pairs <= 90,
            f"{by_p[0.65].mean_pairs:.1f}",
        ),
    ]
    for name, ok, value in checks:
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {value}")
    print(f"\n{elapsed:.1f} s for {len(rows) * reps} gate runs")


if __name__ == "__main__":
    main()
