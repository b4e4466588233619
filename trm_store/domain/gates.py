"""Sequential gates (seed task 6): events on `gate:{id}` and the `gates` projection.

`gate.started` records everything needed to reproduce the run (parameters, shuffle seed, both
snapshots, pool size); one `gate.block_evaluated` per block records its units, W/L/ties, the INFRA
units of each arm, baseline cache hits and the e-values after it; `gate.decided` the verdict.
`trm_gate.Gate` writes them; this module owns their models, the read model and the queries.
E-values are stored as logarithms: they are finite, where an e-value may overflow a float.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, JsonValue
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)

from trm_store.domain._common import (
    DomainModel,
    Positive,
    Real,
    as_utc,
    check_id,
    row_by_key,
    stream_id,
)
from trm_store.domain.errors import UnknownGateError
from trm_store.events import RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "BLOCK_EVALUATED",
    "DECIDED",
    "FAILED",
    "RESUMED",
    "STARTED",
    "BlockEvaluated",
    "GateDecided",
    "GateResumed",
    "GateStarted",
    "gate_blocks",
    "gate_info",
    "gate_stream",
    "list_gates",
]

STREAM = "gate"
PROJECTION = "gates"

_Id = Annotated[str, Field(min_length=1, max_length=255)]
_BlockCount = Annotated[int, Field(ge=0, lt=2**31)]
"""A count within one block: the projection adds them up in BIGINT columns, which hold the
totals of 2**32 such blocks (a block holds far fewer units than 2**31)."""
Verdict = Literal["accept", "reject", "inconclusive", "infra_abort"]


class GateStarted(DomainModel):
    baseline_snapshot: _Id
    candidate_snapshot: _Id
    seed: int = Field(ge=0, lt=2**63)
    pool_size: Positive
    config: dict[str, JsonValue]
    # sha256 of the pool as given (JSON list): `Gate.resume` refuses another pool, or the same
    # units in another order (another unit order). None in gates started by an older trm.
    pool_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")


class BlockEvaluated(DomainModel):
    block: int = Field(ge=1)
    unit_ids: list[_Id] = Field(min_length=1)
    wins: _BlockCount
    losses: _BlockCount
    ties: _BlockCount
    infra_baseline: list[_Id]
    infra_candidate: list[_Id]
    baseline_cache_hits: _BlockCount
    log_e_value: Real
    log_futility_e_value: Real
    decision: Literal["continue", "accept", "reject", "inconclusive", "infra_abort"]
    # The block's pairing, so `Gate.resume` replays the e-processes exactly: one D per paired
    # unit, one [baseline score, candidate score] per INFRA unit (null for the INFRA arm).
    # Absent in blocks recorded before resume existed (such a gate cannot be resumed).
    deltas: list[float] | None = None
    infra_scores: list[Annotated[list[float | None], Field(min_length=2, max_length=2)]] | None = (
        None
    )


class GateDecided(DomainModel):
    verdict: Verdict
    reason: str = Field(max_length=1000)
    blocks: int = Field(ge=1)
    units_evaluated: int = Field(ge=0)
    wins: int = Field(ge=0)
    losses: int = Field(ge=0)
    ties: int = Field(ge=0)
    infra_units_baseline: int = Field(ge=0)
    infra_units_candidate: int = Field(ge=0)
    baseline_cache_hits: int = Field(ge=0)
    log_e_value: Real
    log_futility_e_value: Real


class GateFailed(DomainModel):
    """An arm raised (or the run was cancelled) during `block`, or (`reason="stale"`) its
    process is gone (`mark_stale_gates`): the gate decided nothing."""

    error: str = Field(max_length=1000)
    block: int = Field(ge=1)
    reason: Literal["error", "stale"] = "error"


class GateResumed(DomainModel):
    """A new process took the gate over after block `after_block` (`Gate.resume`): it holds the
    gate's lease from now on (the host and pid in this event's meta)."""

    after_block: int = Field(ge=0)
    taken_from: str = Field(max_length=1000)


STARTED = "gate.started"
BLOCK_EVALUATED = "gate.block_evaluated"
DECIDED = "gate.decided"
FAILED = "gate.failed"
RESUMED = "gate.resumed"
register_event_type(STARTED, GateStarted)
register_event_type(RESUMED, GateResumed)
register_event_type(BLOCK_EVALUATED, BlockEvaluated)
register_event_type(DECIDED, GateDecided)
register_event_type(FAILED, GateFailed)


def gate_stream(gate_id: str) -> str:
    """The gate's stream id."""
    return stream_id(STREAM, gate_id)


class GatesProjection(Projection):
    """`gates`: one row per gate, its parameters and running totals, then its verdict."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 5  # 4 came twice: exact values (issue 14) and gate.resumed (17)
    event_types: ClassVar[frozenset[str]] = frozenset(
        {STARTED, BLOCK_EVALUATED, DECIDED, FAILED, RESUMED}
    )

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        gates = Table(
            f"gates{suffix}",
            metadata,
            Column("gate_id", String(255), primary_key=True),
            Column("status", String(16), nullable=False),
            Column("verdict", String(16), nullable=True),
            Column("reason", Text, nullable=True),
            Column("baseline_snapshot", String(255), nullable=False),
            Column("candidate_snapshot", String(255), nullable=False),
            Column("seed", BigInteger, nullable=False),
            Column("pool_size", BigInteger, nullable=False),
            Column("config", JsonColumn, nullable=False),
            Column("blocks", BigInteger, nullable=False),
            Column("units_evaluated", BigInteger, nullable=False),
            Column("wins", BigInteger, nullable=False),
            Column("losses", BigInteger, nullable=False),
            Column("ties", BigInteger, nullable=False),
            Column("infra_units_baseline", BigInteger, nullable=False),
            Column("infra_units_candidate", BigInteger, nullable=False),
            Column("baseline_cache_hits", BigInteger, nullable=False),
            Column("log_e_value", Float, nullable=False),
            Column("log_futility_e_value", Float, nullable=False),
            Column("started_at", DateTime(timezone=True), nullable=False),
            Column("decided_at", DateTime(timezone=True), nullable=True),
            # The gate's lease, derived from its own events: the process that started it, or
            # last resumed it (the host and pid the store puts in every event's meta), and when
            # it last wrote.
            Column("host", String(255), nullable=True),
            Column("pid", Integer, nullable=True),
            Column("last_event_at", DateTime(timezone=True), nullable=False),
            Column("version", Integer, nullable=False),
        )
        Index(f"ix_gates_status{suffix}", gates.c.status)
        return {"gates": gates}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        gates = tables["gates"]
        for event in events:
            gate_id = event.stream_id.removeprefix(f"{STREAM}:")
            key = gates.c.gate_id == gate_id
            data = event.data
            touched = {"last_event_at": event.recorded_at, "version": event.version}
            if event.type == STARTED:
                conn.execute(insert(gates).values(**_started_row(gate_id, event)))
                continue
            change: dict[str, Any]
            if event.type == BLOCK_EVALUATED:
                change = dict(
                    blocks=gates.c.blocks + 1,
                    units_evaluated=gates.c.units_evaluated + len(data["unit_ids"]),
                    wins=gates.c.wins + data["wins"],
                    losses=gates.c.losses + data["losses"],
                    ties=gates.c.ties + data["ties"],
                    infra_units_baseline=gates.c.infra_units_baseline + len(data["infra_baseline"]),
                    infra_units_candidate=gates.c.infra_units_candidate
                    + len(data["infra_candidate"]),
                    baseline_cache_hits=gates.c.baseline_cache_hits + data["baseline_cache_hits"],
                    log_e_value=data["log_e_value"],
                    log_futility_e_value=data["log_futility_e_value"],
                )
            elif event.type == FAILED:
                ended = event.recorded_at
                change = {"status": "failed", "reason": data["error"], "decided_at": ended}
            elif event.type == RESUMED:  # the new holder's lease: running again, its host and pid
                change = {"status": "running", "reason": None, "decided_at": None}
                change.update(_holder(event.meta))
            else:
                change = {
                    "status": "decided",
                    "verdict": data["verdict"],
                    "reason": data["reason"],
                    "decided_at": event.recorded_at,
                }
            conn.execute(update(gates).where(key).values(**touched, **change))


def _started_row(gate_id: str, event: RecordedEvent) -> dict[str, Any]:
    data = event.data
    return {
        "gate_id": gate_id,
        "status": "running",
        "verdict": None,
        "reason": None,
        "baseline_snapshot": data["baseline_snapshot"],
        "candidate_snapshot": data["candidate_snapshot"],
        "seed": data["seed"],
        "pool_size": data["pool_size"],
        "config": data["config"],
        "blocks": 0,
        "units_evaluated": 0,
        "wins": 0,
        "losses": 0,
        "ties": 0,
        "infra_units_baseline": 0,
        "infra_units_candidate": 0,
        "baseline_cache_hits": 0,
        "log_e_value": 0.0,
        "log_futility_e_value": 0.0,
        "started_at": event.recorded_at,
        "decided_at": None,
        **_holder(event.meta),
        "last_event_at": event.recorded_at,
        "version": event.version,
    }


def _holder(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The started event's `host` and `pid` meta (the appending process, as the store records
    it), when both are there and fit their columns; else None for both (age alone then)."""
    host, pid = meta.get("host"), meta.get("pid")
    if (
        isinstance(host, str)
        and 0 < len(host) <= 255
        and isinstance(pid, int)
        and not isinstance(pid, bool)
        and 0 < pid < 2**31
    ):
        return {"host": host, "pid": pid}
    return {"host": None, "pid": None}


register_projection(GatesProjection())


def _row_dict(row: Any) -> dict[str, Any]:
    out = dict(row._mapping)
    out["started_at"] = as_utc(out["started_at"])
    out["decided_at"] = None if out["decided_at"] is None else as_utc(out["decided_at"])
    out["last_event_at"] = as_utc(out["last_event_at"])
    return out


def gate_info(store: Store, gate_id: str) -> dict[str, Any]:
    """The gate as the `gates` table has it: status (`running` / `decided` / `failed`), verdict,
    reason, snapshots, seed, parameters, running totals and log e-values, start and end times,
    its holder (`host`, `pid` of the process that started it), `last_event_at`
    and its stream `version`."""
    row = row_by_key(store, PROJECTION, "gates", "gate_id", check_id("gate_id", gate_id))
    if row is None:
        raise UnknownGateError(f"no gate {gate_id!r} was started")
    return _row_dict(row)


def list_gates(store: Store) -> list[dict[str, Any]]:
    """Every gate, most recently started first."""
    with store.query(PROJECTION) as (conn, tables):
        gates = tables["gates"]
        rows = conn.execute(
            select(gates).order_by(gates.c.started_at.desc(), gates.c.gate_id)
        ).all()
    return [_row_dict(r) for r in rows]


def gate_blocks(store: Store, gate_id: str) -> list[dict[str, Any]]:
    """The gate's `block_evaluated` events' data, in order (straight from its stream)."""
    check_id("gate_id", gate_id)
    events = store.read_stream(gate_stream(gate_id))
    if not events:
        raise UnknownGateError(f"no gate {gate_id!r} was started")
    return [
        {**e.data, "recorded_at": as_utc(e.recorded_at)}
        for e in events
        if e.type == BLOCK_EVALUATED
    ]
