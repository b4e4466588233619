"""The "bounded" INFRA policy (issue 19 point 1), as hypothesis properties and one gate run.

1. Each bounded e-value is at most the e-value the same units would give on any completion of
   the INFRA arms' unknown scores (here: the answers the spec drew for them), so it is dominated
   by the process on the true outcomes, whatever caused INFRA.
2. With no INFRA units the bounded gate is the "exclude" gate: same verdict, W/L, e-values.
3. On a real store, a candidate whose INFRA falls on its losses is accepted by "exclude" and not
   by "bounded", with the same W/L in both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings

from tests.gate.arms import ERROR, OK, WRONG, TableArm, units
from tests.gate.test_fidelity import UnitSpec, block_lists, configs, gate
from trm_gate import Arm, Gate, GateConfig, e_accept, e_futility
from trm_store import Store, open_store
from trm_store.domain.gates import gate_stream

ENDLESS = GateConfig(
    alpha=1e-300, beta=1e-300, infra_max_rate=1.0, infra_margin=0.999, infra_alpha=1e-300
)
"""Thresholds out of reach: every block is folded in, so the e-values cover all units."""


def true_deltas(blocks: list[list[UnitSpec]]) -> list[float]:
    """Every unit's D from the answers drawn for it, INFRA or not (a completion)."""
    out = []
    for blk in blocks:
        for u in blk:
            c = Fraction(sum(u.candidate), len(u.candidate))
            b = Fraction(sum(u.baseline), len(u.baseline))
            out.append(float(c) - float(b))
    return out


@settings(max_examples=300, deadline=None)
@given(block_lists(infra=True))
def test_bounded_e_values_never_exceed_those_of_any_completion(
    blocks: list[list[UnitSpec]],
) -> None:
    state = gate(ENDLESS, blocks)
    assert state.blocks == len(blocks)
    deltas = true_deltas(blocks)
    wins = sum(1 for d in deltas if d > 0)
    losses = sum(1 for d in deltas if d < 0)
    assert state.e_value <= e_accept(deltas, ENDLESS.accept_grid) * (1 + 1e-12)
    assert state.futility_e_value <= e_futility(wins, losses, ENDLESS.p1, ENDLESS.futility_grid) * (
        1 + 1e-12
    )


@settings(max_examples=300, deadline=None)
@given(block_lists(infra=True))
def test_bounded_counts_each_infra_unit_at_its_worst_case(blocks: list[list[UnitSpec]]) -> None:
    state = gate(ENDLESS, blocks)
    worst_accept, worst_futility = [], []
    for blk in blocks:
        for u in blk:
            b = 1.0 if u.baseline_infra else sum(u.baseline) / len(u.baseline)
            c = 0.0 if u.candidate_infra else sum(u.candidate) / len(u.candidate)
            worst_accept.append(c - b)
            b = 0.0 if u.baseline_infra else sum(u.baseline) / len(u.baseline)
            c = 1.0 if u.candidate_infra else sum(u.candidate) / len(u.candidate)
            worst_futility.append(c - b)
    assert state.e_value == e_accept(worst_accept, ENDLESS.accept_grid)
    fw = sum(1 for d in worst_futility if d > 0)
    fl = sum(1 for d in worst_futility if d < 0)
    assert (state.futility_wins, state.futility_losses) == (fw, fl)
    assert state.futility_e_value == e_futility(fw, fl, ENDLESS.p1, ENDLESS.futility_grid)


@settings(max_examples=300, deadline=None)
@given(configs, block_lists(infra=False))
def test_without_infra_bounded_equals_exclude(
    config: GateConfig, blocks: list[list[UnitSpec]]
) -> None:
    bounded = gate(replace(config, infra_policy="bounded"), blocks)
    excluded = gate(replace(config, infra_policy="exclude"), blocks)
    assert bounded == replace(excluded, config=bounded.config)


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url) as s:
        yield s


async def test_infra_on_the_candidates_losses_is_accepted_only_when_excluded(
    store: Store,
) -> None:
    # 40 units in one block: the candidate wins 12, ties 24, and is INFRA on the 4 units where
    # it would have lost (the baseline was right). 4 candidate-only INFRA units of 40 do not trip
    # the guard; "exclude" sees 12 wins and no loss.
    pool = units(40)
    wins, lost = pool[:12], pool[12:16]
    base = TableArm({u: [WRONG if u in wins else OK] for u in pool})
    cand = TableArm({u: [ERROR if u in lost else OK] for u in pool})
    results = {}
    for policy in ("exclude", "bounded"):
        g = Gate(store, block_size=40, infra_policy=policy)  # type: ignore[arg-type]
        results[policy] = await g.run(
            f"g-{policy}", pool, baseline=Arm(f"b-{policy}", base), candidate=Arm("c", cand), seed=1
        )
        started = store.read_stream(gate_stream(f"g-{policy}"))[0]
        assert started.data["config"]["infra_policy"] == policy
    exclude, bounded = results["exclude"], results["bounded"]
    assert exclude.verdict == "accept" and bounded.verdict == "inconclusive"
    assert (exclude.wins, exclude.losses, exclude.ties) == (
        bounded.wins,
        bounded.losses,
        bounded.ties,
    )
    assert (bounded.wins, bounded.losses, bounded.ties, bounded.infra_units_candidate) == (
        12,
        0,
        24,
        4,
    )
    assert bounded.e_value < exclude.e_value
