"""Operating characteristics of trm_gate's sequential gate, by seeded simulation.

Runs the shipped pure core (`trm_gate.run_blocks`, default bet grids and guard) on simulated
outcomes, under both INFRA policies ("bounded", the default, and "exclude"), and prints per
scenario: P(accept), P(reject), P(inconclusive), P(infra_abort), P(infra_abort within 60 units),
E[discordant pairs], E[units] and E[units] at an abort. References measured in the same run on the
same simulated data:
  * a fixed-n one-sided sign test (alpha .05) re-run after every block ("peeking"), whose false
    accept rate at P(W) = .5 is what the gate's anytime-valid guarantee avoids;
  * the fixed sample size a one-sided sign test needs for power .8 at P(W) = .6, against which
    the gate's E[discordant pairs] is given as a ratio.

A simulated unit is one question per arm: with probability `--tie-rate` the arms agree (both right
or both wrong, equally likely: a tie), otherwise the pair is discordant and the candidate wins with
probability P(W). INFRA, per scenario: none; the candidate INFRA on a share of the units it would
have lost (outcome-dependent: a prompt that breaks the parser exactly where the model is wrong);
the same random rate in both arms, independently; the candidate at a random rate, the baseline
never. An INFRA arm's score is hidden from the gate, which sees only the other arm's score.
Rows named `-300` use a pool of 300 units (the measurement in issue 19), the others the pool of
`--pool-units`.

Usage: python bench/gate_oc.py [--reps 10000] [--seed 20240605] [--tie-rate 0.5]
                               [--block-size 20] [--max-pairs 400] [--pool-units 4000]
                               [--only NAME]   (e.g. --only dep30: one scenario, for a quick look)
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trm_gate import BlockPairing, GateConfig, InfraPolicy, run_blocks

ANCHOR_EN = {0.6: 171, 0.65: 75, 0.7: 43}  # SPEC section 3, discordant pairs
SIGN_TEST_HORIZONS = (100, 400, 1000)  # discordant pairs over which the peeking test runs
CHUNK = 500  # replications generated at once (bounds memory)
ABORT_HORIZON = 60  # "within three blocks of 20"
POLICIES: tuple[InfraPolicy, ...] = ("bounded", "exclude")

Scores = npt.NDArray[np.int8]
Flags = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Scenario:
    """A true win rate and how INFRA strikes: `on_losses` of the candidate's losses, `both` of
    every unit in each arm independently, `candidate` of every candidate unit."""

    name: str
    p: float
    on_losses: float = 0.0
    both: float = 0.0
    candidate: float = 0.0
    pool: int | None = None  # units in the pool; None: --pool-units

    @property
    def infra(self) -> str:
        parts = []
        if self.on_losses:
            parts.append(f"cand. on {self.on_losses:.0%} of its losses")
        if self.both:
            parts.append(f"{self.both:.0%} random, both arms")
        if self.candidate:
            parts.append(f"cand. {self.candidate:.0%} random, base 0%")
        return "; ".join(parts) or "none"


SCENARIOS = (
    Scenario("p50", 0.5),
    Scenario("p55", 0.55),
    Scenario("p60", 0.6),
    Scenario("p65", 0.65),
    Scenario("p70", 0.7),
    Scenario("dep30", 0.5, on_losses=0.3),
    Scenario("dep45", 0.5, on_losses=0.45),
    Scenario("dep30-p45", 0.45, on_losses=0.3),
    Scenario("dep30-300", 0.5, on_losses=0.3, pool=300),  # the measurement: 300 units
    Scenario("dep45-300", 0.5, on_losses=0.45, pool=300),
    Scenario("rand5", 0.5, both=0.05),
    Scenario("rand5-p60", 0.6, both=0.05),
    Scenario("rand10", 0.5, both=0.1),
    Scenario("rand10-p60", 0.6, both=0.1),
    Scenario("cand20", 0.5, candidate=0.2),
    Scenario("cand20-p60", 0.6, candidate=0.2),
)


@dataclass(frozen=True)
class Units:
    """reps x units: each arm's score (0/1) and INFRA flag."""

    baseline: Scores
    candidate: Scores
    infra_baseline: Flags
    infra_candidate: Flags

    @property
    def deltas(self) -> Scores:
        """The true D of every unit, INFRA or not."""
        return (self.candidate - self.baseline).astype(np.int8)


def simulate_units(
    rng: np.random.Generator, reps: int, units: int, scenario: Scenario, tie_rate: float
) -> Units:
    """Draw `reps` replications of `units` units under `scenario`."""
    shape = (reps, units)
    tie = rng.random(shape) < tie_rate
    tie_score = rng.random(shape) < 0.5
    win = rng.random(shape) < scenario.p
    baseline = np.where(tie, tie_score, ~win).astype(np.int8)
    candidate = np.where(tie, tie_score, win).astype(np.int8)
    loss = candidate < baseline
    ic = (loss & (rng.random(shape) < scenario.on_losses)) | (rng.random(shape) < scenario.both)
    ic |= rng.random(shape) < scenario.candidate
    ib = rng.random(shape) < scenario.both
    return Units(baseline, candidate, ib, ic)


def blocks_of(u: Units, row: int, block_size: int) -> Iterator[BlockPairing]:
    """One replication's units, cut into blocks (the last may be short), as the gate pairs them:
    INFRA units out of the deltas, each with the score its other arm got."""
    b, c = u.baseline[row].tolist(), u.candidate[row].tolist()
    ib, ic = u.infra_baseline[row].tolist(), u.infra_candidate[row].tolist()
    for start in range(0, len(b), block_size):
        deltas: list[float] = []
        infra: list[tuple[float | None, float | None]] = []
        for i in range(start, min(start + block_size, len(b))):
            if ib[i] or ic[i]:
                infra.append((None if ib[i] else float(b[i]), None if ic[i] else float(c[i])))
            else:
                deltas.append(float(c[i] - b[i]))
        yield BlockPairing(
            units=len(deltas) + len(infra),
            deltas=tuple(deltas),
            infra_baseline=sum(1 for x, _ in infra if x is None),
            infra_candidate=sum(1 for _, y in infra if y is None),
            infra_scores=tuple(infra),
        )


@dataclass
class Row:
    """Operating characteristics of one scenario under one policy."""

    scenario: Scenario
    policy: InfraPolicy
    verdicts: list[str]
    pairs: list[int]
    units: list[int]

    def rate(self, verdict: str) -> float:
        return self.verdicts.count(verdict) / len(self.verdicts)

    @property
    def abort_units(self) -> list[int]:
        return [n for v, n in zip(self.verdicts, self.units, strict=True) if v == "infra_abort"]

    @property
    def abort_within_horizon(self) -> float:
        return sum(1 for n in self.abort_units if n <= ABORT_HORIZON) / len(self.verdicts)


def run_scenario(
    rng: np.random.Generator,
    scenario: Scenario,
    config: GateConfig,
    args: argparse.Namespace,
    crit: npt.NDArray[np.int64],
    peeking: dict[int, int],
) -> list[Row]:
    """Both policies on the same simulated units; the peeking reference at P(W) = .5 without
    INFRA, added into `peeking`."""
    rows = {p: Row(scenario, p, [], [], []) for p in POLICIES}
    configs = {
        p: GateConfig(block_size=config.block_size, max_pairs=config.max_pairs, infra_policy=p)
        for p in POLICIES
    }
    for done in range(0, args.reps, CHUNK):
        n = min(CHUNK, args.reps - done)
        units = simulate_units(rng, n, scenario.pool or args.pool_units, scenario, args.tie_rate)
        for policy, row in rows.items():
            for i in range(n):
                state = run_blocks(configs[policy], blocks_of(units, i, config.block_size))
                row.verdicts.append(str(state.verdict))
                row.pairs.append(state.discordant)
                row.units.append(state.units)
        if scenario.name == "p50":
            for h in SIGN_TEST_HORIZONS:
                hits = peeking_sign_test(units.deltas, config.block_size, h, crit)
                peeking[h] = peeking.get(h, 0) + int(hits.sum())
    return list(rows.values())


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
    outcomes: Scores, block_size: int, horizon: int, crit: npt.NDArray[np.int64]
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
    parser.add_argument("--only", choices=[s.name for s in SCENARIOS], action="append")
    args = parser.parse_args()
    config = GateConfig(block_size=args.block_size, max_pairs=args.max_pairs)
    crit = sign_test_critical(max(SIGN_TEST_HORIZONS), config.alpha)
    print(
        f"trm_gate OC: {args.reps} replications/row, seed {args.seed}, alpha {config.alpha}, "
        f"beta {config.beta}, p1 {config.p1}, block {config.block_size} units, tie rate "
        f"{args.tie_rate}, max_pairs {config.max_pairs}, pool {args.pool_units} units"
    )
    print(f"accept grid {config.accept_grid}; futility grid {config.futility_grid}")
    print(
        f"guard: infra_max_rate {config.infra_max_rate}, infra_margin {config.infra_margin}, "
        f"infra_alpha {config.infra_alpha}, infra_min_units {config.infra_min_units}"
    )
    started = time.perf_counter()
    rows: list[Row] = []
    peek_hits: dict[int, int] = {}
    for index, scenario in enumerate(SCENARIOS):
        if args.only and scenario.name not in args.only:
            continue
        # One generator per scenario, so a scenario's data do not depend on which others ran.
        rng = np.random.default_rng([args.seed, index])
        rows += run_scenario(rng, scenario, config, args, crit, peek_hits)
    elapsed = time.perf_counter() - started
    report(rows, {h: k / args.reps for h, k in peek_hits.items()}, config, args.reps, elapsed)


def report(
    rows: list[Row], peeking: dict[int, float], config: GateConfig, reps: int, elapsed: float
) -> None:
    """Print the table, the references and the target checks."""
    print()
    print(
        "scenario    P(W)  INFRA                            policy   P(acc.)  P(rej.)  P(inc.)"
        f"  P(abort)  P(abort<={ABORT_HORIZON})  E[pairs]  E[units]  E[units|abort]  anchor"
    )
    for r in rows:
        s = r.scenario
        aborts = r.abort_units
        anchor = ANCHOR_EN.get(s.p) if s.infra == "none" else None
        print(
            f"{s.name:<11} {s.p:<5} {s.infra:<32} {r.policy:<8} {r.rate('accept'):>7.4f}  "
            f"{r.rate('reject'):>7.4f}  {r.rate('inconclusive'):>7.4f}  "
            f"{r.rate('infra_abort'):>8.4f}  {r.abort_within_horizon:>13.4f}  "
            f"{np.mean(r.pairs):>8.1f}  {np.mean(r.units):>8.1f}  "
            f"{(f'{np.mean(aborts):.1f}' if aborts else '-'):>14}  {anchor or '-':>6}"
        )
    by = {(r.scenario.name, r.policy): r for r in rows}
    se = math.sqrt(config.alpha * (1 - config.alpha) / reps)
    if "p50" in {r.scenario.name for r in rows} and peeking:
        gate = by["p50", "bounded"].rate("accept")
        print()
        print(f"reference: fixed-n sign test (one-sided, alpha {config.alpha}) re-run every block:")
        for h, rate in peeking.items():
            print(
                f"  false accept at P(W)=.5 within {h:>4} discordant pairs: {rate:.4f}"
                f"  (gate: {gate:.4f}, ratio gate/peeking {gate / rate:.2f})"
            )
    if {("p60", "bounded"), ("p65", "bounded"), ("p70", "bounded")} <= by.keys():
        n_fixed = fixed_n_for_power(config.alpha, 0.6, 0.8)
        print(
            f"reference: fixed-n sign test with power .8 at P(W)=.6 needs n = {n_fixed} pairs; "
            "gate E[pairs] at .6 / .65 / .7 = "
            + " / ".join(
                f"{np.mean(by[n, 'bounded'].pairs) / n_fixed:.2f}" for n in ("p60", "p65", "p70")
            )
            + " x that n"
        )
    print()
    for policy in POLICIES:
        for name, what, value, ok in _checks(by, policy, config.alpha):
            note = ""
            if not ok and policy == "exclude" and name.startswith("dep"):
                note = "  (exclude is valid only when INFRA is independent of the outcomes)"
            print(f"[{'PASS' if ok else 'FAIL'}] {name} {policy}: {what}: {value:.4f}{note}")
    print(f"MC s.e. of a rate near alpha: {se:.4f}")
    print(f"\n{elapsed:.1f} s for {sum(len(r.verdicts) for r in rows)} gate runs")


def _checks(
    by: dict[tuple[str, InfraPolicy], Row], policy: InfraPolicy, alpha: float
) -> Iterator[tuple[str, str, float, bool]]:
    """(scenario, target, measured value, met?) for every target whose scenario ran."""
    targets: list[tuple[str, str, Callable[[Row], float], Callable[[float], bool]]] = [
        ("p50", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("p60", "power >= .75", lambda r: r.rate("accept"), lambda v: v >= 0.75),
        ("p65", "E[disc. pairs] <= 80", lambda r: float(np.mean(r.pairs)), lambda v: v <= 80),
        ("dep30", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("dep45", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("dep30-p45", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("dep30-300", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("dep45-300", "P(accept) <= alpha", lambda r: r.rate("accept"), lambda v: v <= alpha),
        ("rand5", "P(infra_abort) <= .05", lambda r: r.rate("infra_abort"), lambda v: v <= 0.05),
        ("rand10", "P(infra_abort) <= .05", lambda r: r.rate("infra_abort"), lambda v: v <= 0.05),
        (
            "cand20",
            f"P(infra_abort within {ABORT_HORIZON} units) >= .95",
            lambda r: r.abort_within_horizon,
            lambda v: v >= 0.95,
        ),
    ]
    for name, what, measure, met in targets:
        if (name, policy) in by:
            value = measure(by[name, policy])
            yield name, what, value, met(value)


if __name__ == "__main__":
    main()
