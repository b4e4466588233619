"""The pure step: config validation, pairing, decision order, the INFRA guard, pool/cap ends."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from trm_gate import (
    BlockPairing,
    GateConfig,
    GateInputError,
    GateState,
    GateStateError,
    QuestionResult,
    UnitOutcome,
    e_accept,
    e_futility,
    fold_unit,
    pair_block,
    run_blocks,
    step,
)


def block(
    wins: int = 0,
    losses: int = 0,
    ties: int = 0,
    *,
    ib: int = 0,
    ic: int = 0,
    both: int = 0,
    hits: int = 0,
) -> BlockPairing:
    deltas = (1.0,) * wins + (-1.0,) * losses + (0.0,) * ties
    return BlockPairing(
        units=len(deltas) + ib + ic - both,
        deltas=deltas,
        infra_baseline=ib,
        infra_candidate=ic,
        baseline_cache_hits=hits,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": 0.0},
        {"alpha": 1.0},
        {"alpha": math.nan},
        {"alpha": True},
        {"beta": -0.1},
        {"beta": 1.5},
        {"p1": 0.5},
        {"p1": 1.0},
        {"block_size": 0},
        {"block_size": 2.0},
        {"max_pairs": 0},
        {"infra_max_rate": 1.5},
        {"infra_max_rate": math.nan},
        {"infra_min_units": 0},
        {"accept_grid": ()},
        {"futility_grid": (0.6,)},
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(GateInputError):
        GateConfig(**kwargs)  # type: ignore[arg-type]


def test_config_record_names_every_parameter() -> None:
    rec = GateConfig(max_pairs=300).to_record()
    assert rec["max_pairs"] == 300 and rec["alpha"] == 0.05 and len(rec["accept_grid"]) == 6


def unit(uid: str, *correct: bool | None, stop: str = "stop") -> UnitOutcome:
    return fold_unit(
        QuestionResult(f"{uid}-q{i}", uid, c, stop if c is None else "stop")
        for i, c in enumerate(correct)
    )


def test_pair_block_computes_deltas_and_excludes_infra_of_either_arm() -> None:
    base = {
        "a": unit("a", True, False),  # 0.5
        "b": unit("b", True),  # 1.0
        "c": unit("c", None, stop="error"),  # INFRA baseline
        "d": unit("d", False),
    }
    cand = {
        "a": unit("a", True, True),  # 1.0 -> +0.5
        "b": unit("b", True),  # tie
        "c": unit("c", True),
        "d": unit("d", None, stop="parse_error"),  # INFRA candidate
    }
    pairing = pair_block(base, cand, cached=["b"])
    assert sorted(pairing.deltas) == [0.0, 0.5]
    assert (pairing.wins, pairing.losses, pairing.ties) == (1, 0, 1)
    assert (pairing.infra_baseline, pairing.infra_candidate) == (1, 1)
    assert pairing.units == 4 and pairing.baseline_cache_hits == 1
    assert pairing.baseline_evaluated == 3


def test_pair_block_refuses_mismatched_arms_and_cached_infra() -> None:
    ok = {"a": unit("a", True)}
    with pytest.raises(GateInputError, match="different units"):
        pair_block(ok, {"b": unit("b", True)})
    with pytest.raises(GateInputError, match="outside the block"):
        pair_block(ok, ok, cached=["z"])
    infra = {"a": unit("a", None, stop="error")}
    with pytest.raises(GateInputError, match="cannot be INFRA"):
        pair_block(infra, ok, cached=["a"])
    with pytest.raises(GateInputError, match="another unit"):
        pair_block({"a": unit("x", True)}, {"a": unit("a", True)})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"units": 3, "deltas": (1.0,), "infra_baseline": 0, "infra_candidate": 0},
        {"units": 1, "deltas": (2.0,), "infra_baseline": 0, "infra_candidate": 0},
        {"units": 2, "deltas": (math.nan,), "infra_baseline": 1, "infra_candidate": 0},
        {"units": 2, "deltas": (), "infra_baseline": 3, "infra_candidate": 0},
        {
            "units": 2,
            "deltas": (1.0, 1.0),
            "infra_baseline": 0,
            "infra_candidate": 0,
            "baseline_cache_hits": 3,
        },
    ],
)
def test_inconsistent_block_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(GateInputError):
        BlockPairing(**kwargs)  # type: ignore[arg-type]


def test_wins_accept_with_e_value_equal_to_e_accept() -> None:
    state, decision = step(GateState(GateConfig()), block(wins=20))
    assert decision.verdict == "accept" and decision.final
    assert state.verdict == "accept"
    assert state.e_value == e_accept([1.0] * 20)
    assert state.futility_e_value == e_futility(20, 0, 0.6)
    assert "1/alpha" in decision.reason


def test_losses_reject() -> None:
    state, decision = step(GateState(GateConfig()), block(losses=20))
    assert decision.verdict == "reject"
    assert (state.wins, state.losses) == (0, 20)


def test_balanced_block_continues_and_accumulates() -> None:
    s0 = GateState(GateConfig())
    s1, d1 = step(s0, block(wins=3, losses=3, ties=4))
    assert d1.verdict == "continue" and not d1.final and s1.verdict is None
    s2, _ = step(s1, block(wins=2, losses=1, ties=1))
    assert (s2.blocks, s2.units, s2.wins, s2.losses, s2.ties) == (2, 14, 5, 4, 5)
    assert s2.e_value == e_accept([1.0] * 5 + [-1.0] * 4)


def test_end_of_pool_is_inconclusive() -> None:
    state, decision = step(GateState(GateConfig()), block(wins=2, losses=2), final=True)
    assert decision.verdict == "inconclusive" and "pool" in decision.reason
    assert state.verdict == "inconclusive" and state.reason == decision.reason


def test_pair_cap_counts_discordant_pairs_only() -> None:
    cfg = GateConfig(max_pairs=6)
    s1, d1 = step(GateState(cfg), block(wins=2, losses=2, ties=10))
    assert d1.verdict == "continue"
    s2, d2 = step(s1, block(wins=1, losses=1))
    assert d2.verdict == "inconclusive" and "cap" in d2.reason
    assert s2.discordant == 6


def test_step_after_the_verdict_is_refused() -> None:
    state, _ = step(GateState(GateConfig()), block(wins=20))
    with pytest.raises(GateStateError):
        step(state, block(ties=1))


def test_accept_takes_precedence_when_both_cross_in_one_block() -> None:
    cfg = GateConfig(p1=0.9, accept_grid=(0.5,), futility_grid=(0.5,))
    state, decision = step(GateState(cfg), block(wins=40, losses=18))
    assert state.e_value >= 20 and state.futility_e_value >= 5  # both crossed
    assert decision.verdict == "accept"


def test_guard_takes_precedence_over_accept() -> None:
    # "exclude", so the 10 INFRA units leave E+ alone and it crosses 1/alpha in this block.
    state, decision = step(GateState(GateConfig(infra_policy="exclude")), block(wins=20, ic=10))
    assert state.e_value >= 20
    assert decision.verdict == "infra_abort" and "candidate" in decision.reason


def test_baseline_cache_hits_count_as_evaluated_non_infra_units() -> None:
    # Issue 19 point 4 (this replaces the old test that left hits out of the baseline's rate):
    # 3 INFRA among 20 baseline units, 10 of them cache hits, is 3/20, not 3/10.
    hits, _ = step(GateState(GateConfig()), block(ties=17, ib=3, hits=10))
    fresh, _ = step(GateState(GateConfig()), block(ties=17, ib=3))
    assert hits.verdict is None and fresh.verdict is None
    # The guard sees the same counts either way: the cache does not move the rule.
    assert (hits.units, hits.infra_baseline) == (fresh.units, fresh.infra_baseline) == (20, 3)


def test_guard_is_cumulative_across_blocks() -> None:
    s1, d1 = step(GateState(GateConfig()), block(ties=8, ic=7, ib=1, both=1))
    assert d1.verdict == "continue"  # 7/15 INFRA is not yet evidence enough (e-values < 20)
    _, d2 = step(s1, block(ties=0, ic=2))
    assert d2.verdict == "infra_abort" and "9/17" in d2.reason  # the same test, two more units


def test_run_blocks_stops_at_the_verdict_and_consumes_no_further() -> None:
    consumed: list[int] = []

    def blocks() -> Iterator[BlockPairing]:
        for i in range(100):
            consumed.append(i)
            yield block(wins=20)

    state = run_blocks(GateConfig(), blocks())
    assert state.verdict == "accept" and state.blocks == 1
    assert consumed == [0, 1]  # one block of look-ahead to know whether it was the last


def test_run_blocks_refuses_an_empty_pool_and_ends_inconclusive_when_exhausted() -> None:
    with pytest.raises(GateInputError, match="empty"):
        run_blocks(GateConfig(), [])
    state = run_blocks(GateConfig(), [block(wins=1, losses=1), block(ties=3)])
    assert state.verdict == "inconclusive" and state.blocks == 2 and state.ties == 3
