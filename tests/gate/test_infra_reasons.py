"""The INFRA stop reasons are a parameter of the gate and its guard (issue 17 point 2, taken up
by issue 19): the default is the vocabulary's {error, parse_error}; another set changes what is
folded as INFRA, and the baseline cache still never holds a vocabulary-INFRA question."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gate.arms import OK, WRONG, table, units
from trm_gate import (
    INFRA_STOP_REASONS,
    Arm,
    ArmResultError,
    Gate,
    GateConfig,
    GateInputError,
    QuestionResult,
    fold_unit,
    fold_units,
)
from trm_store import Store, open_store
from trm_store.domain.baseline import BaselineCache

UNREADABLE_WRONG = (False, "parse_error")  # graded as wrong by a harness that says so
TRUNCATED = (False, "length")


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url) as s:
        yield s


def test_the_default_is_the_vocabulary() -> None:
    assert GateConfig().infra_reasons == INFRA_STOP_REASONS == frozenset({"error", "parse_error"})
    assert GateConfig(infra_reasons={"error"}).infra_reasons == frozenset({"error"})


def test_the_fold_follows_the_reasons() -> None:
    q = [QuestionResult("q1", "u", True, "stop"), QuestionResult("q2", "u", False, "parse_error")]
    with pytest.raises(GateInputError, match="has no verdict"):  # INFRA by default: no verdict
        fold_unit(q)
    assert fold_unit([q[0], QuestionResult("q2", "u", None, "parse_error")]).infra
    scored = fold_unit(q, infra_reasons=frozenset({"error"}))
    assert not scored.infra and scored.score == 0.5
    assert fold_unit([q[0]], infra_reasons=frozenset({"stop"})).infra
    # Not INFRA under the gate's reasons, so it needs a verdict.
    unread = [QuestionResult("q3", "u", None, "parse_error")]
    with pytest.raises(GateInputError, match="no correct verdict"):
        fold_unit(unread, infra_reasons=frozenset({"error"}))
    with pytest.raises(ArmResultError, match="no correct verdict"):
        fold_units(unread, ["u"], infra_reasons=frozenset({"error"}))


async def test_a_gate_that_scores_unreadable_replies_never_caches_them(store: Store) -> None:
    pool = units(10)
    base = table(pool, OK, u000=UNREADABLE_WRONG)
    cand = table(pool, OK)
    result = await Gate(store, block_size=10, infra_reasons=frozenset({"error"})).run(
        "g", pool, baseline=Arm("b", base), candidate=Arm("c", cand), seed=1
    )
    assert result.infra_units_baseline == 0 and (result.wins, result.ties) == (1, 9)
    cache = BaselineCache(store)
    assert cache.get("b", "u000") is None  # the vocabulary calls it INFRA: never cached
    assert all(cache.get("b", u) is not None for u in pool[1:])


async def test_a_cached_unit_that_is_infra_for_this_gate_is_evaluated_again(store: Store) -> None:
    pool = units(10)
    base = table(pool, OK, u003=TRUNCATED)
    first = await Gate(store, block_size=10).run(
        "g1", pool, baseline=Arm("b", base), candidate=Arm("c", table(pool, WRONG)), seed=1
    )
    assert first.infra_units_baseline == 0 and BaselineCache(store).get("b", "u003") is not None
    strict = Gate(store, block_size=10, infra_reasons=INFRA_STOP_REASONS | {"length"})
    second = await strict.run(
        "g2", pool, baseline=Arm("b", base), candidate=Arm("c", table(pool, WRONG)), seed=2
    )
    assert base.calls[-1] == ["u003"]  # the other nine came from the cache
    assert second.baseline_cache_hits == 9 and second.infra_units_baseline == 1
