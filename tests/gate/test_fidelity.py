"""Fidelity invariant (SPEC section 3), as hypothesis properties.

1. With no INFRA units, the gate's pure path (QuestionResult -> fold_units -> pair_block ->
   step, block after block) gives the same verdict and W/L as a plain paired-flip procedure
   written here independently: exact rational arithmetic, recomputing both e-values from
   scratch after every block.
2. With INFRA units and the guard not tripped, under `infra_policy="exclude"` the verdict,
   W/L/ties and e-values equal those of the same gate run on the same blocks with the INFRA
   units removed; under either policy W/L/ties do. (The default "bounded" policy's own
   properties are in test_bounded.py.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trm_gate import GateConfig, GateState, QuestionResult, fold_units, pair_block, run_blocks
from trm_gate.pairing import BlockPairing

BETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)


@dataclass(frozen=True)
class UnitSpec:
    """One unit's questions in both arms, and whether each arm hit an INFRA failure."""

    uid: str
    baseline: tuple[bool, ...]
    candidate: tuple[bool, ...]
    baseline_infra: bool = False
    candidate_infra: bool = False


def unit_specs(infra: bool) -> st.SearchStrategy[UnitSpec]:
    answers = st.lists(st.booleans(), min_size=1, max_size=3).map(tuple)
    flag = st.sampled_from([False] * 9 + [True]) if infra else st.just(False)
    return st.builds(
        UnitSpec,
        uid=st.just(""),
        baseline=answers,
        candidate=answers,
        baseline_infra=flag,
        candidate_infra=flag,
    )


def block_lists(infra: bool) -> st.SearchStrategy[list[list[UnitSpec]]]:
    raw = st.lists(st.lists(unit_specs(infra), min_size=1, max_size=6), min_size=1, max_size=8)

    def name(blocks: list[list[UnitSpec]]) -> list[list[UnitSpec]]:
        return [
            [
                UnitSpec(f"u{b}-{i}", u.baseline, u.candidate, u.baseline_infra, u.candidate_infra)
                for i, u in enumerate(blk)
            ]
            for b, blk in enumerate(blocks)
        ]

    return raw.map(name)


configs = st.builds(
    GateConfig,
    alpha=st.floats(0.05, 0.5),
    beta=st.floats(0.05, 0.5),
    p1=st.floats(0.51, 0.95),
    max_pairs=st.none() | st.integers(1, 30),
    accept_grid=st.lists(st.sampled_from(BETS), min_size=1, max_size=4, unique=True).map(tuple),
    futility_grid=st.lists(st.sampled_from(BETS), min_size=1, max_size=4, unique=True).map(tuple),
    infra_max_rate=st.floats(0.2, 1.0),
    infra_min_units=st.integers(5, 60),
    infra_policy=st.sampled_from(["bounded", "exclude"]),
)


def arm_results(specs: list[UnitSpec], arm: str) -> list[QuestionResult]:
    out = []
    for u in specs:
        answers = u.baseline if arm == "baseline" else u.candidate
        infra = u.baseline_infra if arm == "baseline" else u.candidate_infra
        for i, ok in enumerate(answers):
            failed = infra and i == 0  # one INFRA question is enough to make the unit INFRA
            out.append(
                QuestionResult(
                    f"{u.uid}-q{i}", u.uid, None if failed else ok, "error" if failed else "stop"
                )
            )
    return out


def pair(specs: list[UnitSpec]) -> BlockPairing:
    ids = [u.uid for u in specs]
    return pair_block(
        fold_units(arm_results(specs, "baseline"), ids),
        fold_units(arm_results(specs, "candidate"), ids),
    )


def gate(config: GateConfig, blocks: list[list[UnitSpec]]) -> GateState:
    return run_blocks(config, (pair(blk) for blk in blocks))


def reference(config: GateConfig, blocks: list[list[UnitSpec]]) -> tuple[str, int, int]:
    """Plain paired flips, exact arithmetic, e-values recomputed from scratch per block."""
    alpha, beta, p1 = Fraction(config.alpha), Fraction(config.beta), Fraction(config.p1)
    deltas: list[Fraction] = []
    for blk in blocks:
        for u in blk:
            deltas.append(
                Fraction(sum(u.candidate), len(u.candidate))
                - Fraction(sum(u.baseline), len(u.baseline))
            )
        w = sum(1 for d in deltas if d > 0)
        lo = sum(1 for d in deltas if d < 0)
        e_plus = sum(
            (
                math.prod((1 + Fraction(g) * d for d in deltas), start=Fraction(1))
                for g in config.accept_grid
            ),
            start=Fraction(0),
        ) / len(config.accept_grid)
        e_minus = sum(
            (
                (1 - Fraction(g)) ** w * (1 + Fraction(g) * p1 / (1 - p1)) ** lo
                for g in config.futility_grid
            ),
            start=Fraction(0),
        ) / len(config.futility_grid)
        for value, threshold in ((e_plus, 1 / alpha), (e_minus, 1 / beta)):
            # Floats and exact rationals may disagree within rounding of a threshold: skip those.
            assume(abs(value / threshold - 1) > 1e-9)
        if e_plus >= 1 / alpha:
            return "accept", w, lo
        if e_minus >= 1 / beta:
            return "reject", w, lo
        if config.max_pairs is not None and w + lo >= config.max_pairs:
            return "inconclusive", w, lo
    return "inconclusive", w, lo


@settings(max_examples=300, deadline=None)
@given(configs, block_lists(infra=False))
def test_without_infra_the_gate_is_the_plain_paired_flip_procedure(
    config: GateConfig, blocks: list[list[UnitSpec]]
) -> None:
    state = gate(config, blocks)
    assert (state.verdict, state.wins, state.losses) == reference(config, blocks)


@settings(max_examples=300, deadline=None)
@given(configs, block_lists(infra=True))
def test_with_infra_the_gate_equals_the_gate_without_those_units(
    config: GateConfig, blocks: list[list[UnitSpec]]
) -> None:
    config = replace(config, infra_policy="exclude")
    with_infra = gate(config, blocks)
    assume(with_infra.verdict != "infra_abort")
    clean = [[u for u in blk if not (u.baseline_infra or u.candidate_infra)] for blk in blocks]
    without = run_blocks(config, (pair(blk) if blk else BlockPairing(0, (), 0, 0) for blk in clean))
    assert (with_infra.verdict, with_infra.wins, with_infra.losses, with_infra.ties) == (
        without.verdict,
        without.wins,
        without.losses,
        without.ties,
    )
    assert (with_infra.e_value, with_infra.futility_e_value) == (
        without.e_value,
        without.futility_e_value,
    )
    assert with_infra.blocks == without.blocks
    assert (with_infra.verdict, with_infra.wins, with_infra.losses) == reference(config, clean)


@settings(max_examples=200, deadline=None)
@given(block_lists(infra=True))
def test_w_l_never_count_infra_units_under_either_policy(blocks: list[list[UnitSpec]]) -> None:
    # Thresholds out of reach, so every block is folded in whatever the policy.
    endless = GateConfig(
        alpha=1e-300, beta=1e-300, infra_max_rate=1.0, infra_margin=0.999, infra_alpha=1e-300
    )
    clean = [[u for u in blk if not (u.baseline_infra or u.candidate_infra)] for blk in blocks]
    reference = run_blocks(endless, (pair(blk) for blk in clean if blk)) if any(clean) else None
    for policy in ("bounded", "exclude"):
        state = gate(replace(endless, infra_policy=policy), blocks)
        assert state.blocks == len(blocks) and state.verdict == "inconclusive"
        expected = (reference.wins, reference.losses, reference.ties) if reference else (0, 0, 0)
        assert (state.wins, state.losses, state.ties) == expected
