"""Workspace manifests (seed task 7): every change is an event on `workspace:{id}`; the manifest
is a projection, and `manifest.json` only a derived view of it (see `manifest_file`).

Event types: `workspace.scaffolded`, `workspace.manifest_updated`, `workspace.run_recorded`,
`workspace.best_updated`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import JsonValue, field_validator
from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
    update,
)

from trm_store.domain._common import (
    DomainModel,
    as_utc,
    check_fields,
    check_id,
    stream_id,
    validated,
)
from trm_store.domain.errors import (
    DomainInputError,
    UnknownWorkspaceError,
    WorkspaceExistsError,
)
from trm_store.domain.runs import require_run
from trm_store.errors import ConcurrencyError
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.schema import JsonColumn

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = [
    "get_manifest",
    "record_run",
    "scaffold_workspace",
    "update_best",
    "update_manifest",
]

STREAM = "workspace"
PROJECTION = "workspaces"
MANIFEST_KEYS = frozenset({"workspace_id", "runs", "best", "created_at", "updated_at", "version"})
"""Keys the manifest derives itself; fields may not shadow them."""


class Scaffolded(DomainModel):
    skills: JsonValue
    prompts: JsonValue
    fields: dict[str, JsonValue]

    @field_validator("skills", "prompts")
    @classmethod
    def _present(cls, value: JsonValue) -> JsonValue:
        if value is None:
            raise ValueError("must not be None")
        return value


class ManifestUpdated(DomainModel):
    changes: dict[str, JsonValue]


class RunRecorded(DomainModel):
    run_id: str
    fields: dict[str, JsonValue]


class BestUpdated(DomainModel):
    fields: dict[str, JsonValue]


SCAFFOLDED = "workspace.scaffolded"
MANIFEST_UPDATED = "workspace.manifest_updated"
RUN_RECORDED = "workspace.run_recorded"
BEST_UPDATED = "workspace.best_updated"

register_event_type(SCAFFOLDED, Scaffolded)
register_event_type(MANIFEST_UPDATED, ManifestUpdated)
register_event_type(RUN_RECORDED, RunRecorded)
register_event_type(BEST_UPDATED, BestUpdated)


class WorkspaceProjection(Projection):
    """`workspaces`: one row per workspace (its manifest fields and best); `workspace_runs`: the
    runs recorded in it, in first-recorded order, later fields merged over earlier ones."""

    name: ClassVar[str] = PROJECTION
    version: ClassVar[int] = 2
    event_types: ClassVar[frozenset[str]] = frozenset(
        {SCAFFOLDED, MANIFEST_UPDATED, RUN_RECORDED, BEST_UPDATED}
    )

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "workspaces": Table(
                f"workspaces{suffix}",
                metadata,
                Column("workspace_id", String(255), primary_key=True),
                Column("fields", JsonColumn, nullable=False),
                Column("best", JsonColumn, nullable=True),
                Column("created_at", DateTime(timezone=True), nullable=False),
                Column("updated_at", DateTime(timezone=True), nullable=False),
                Column("version", Integer, nullable=False),
            ),
            "runs": Table(
                f"workspace_runs{suffix}",
                metadata,
                Column("workspace_id", String(255), primary_key=True),
                Column("run_id", String(255), primary_key=True),
                Column("seq", Integer, nullable=False),
                Column("fields", JsonColumn, nullable=False),
                Column("recorded_at", DateTime(timezone=True), nullable=False),
            ),
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        workspaces, runs = tables["workspaces"], tables["runs"]
        for event in events:
            workspace_id = event.stream_id.removeprefix(f"{STREAM}:")
            touched = {"updated_at": event.recorded_at, "version": event.version}
            key = workspaces.c.workspace_id == workspace_id
            current = conn.execute(select(workspaces.c.fields).where(key)).scalar_one_or_none()
            if event.type == SCAFFOLDED:
                if current is not None:  # only a raw append can get here: refuse it
                    raise WorkspaceExistsError(f"workspace {workspace_id!r} exists already")
                fields = {
                    **event.data["fields"],
                    "skills": event.data["skills"],
                    "prompts": event.data["prompts"],
                }
                conn.execute(
                    insert(workspaces).values(
                        workspace_id=workspace_id,
                        fields=fields,
                        best=None,
                        created_at=event.recorded_at,
                        **touched,
                    )
                )
            elif current is None:
                continue  # a change to a workspace never scaffolded has nothing to change
            elif event.type == MANIFEST_UPDATED:
                merged = {**current, **event.data["changes"]}
                conn.execute(update(workspaces).where(key).values(fields=merged, **touched))
            elif event.type == BEST_UPDATED:
                conn.execute(
                    update(workspaces).where(key).values(best=event.data["fields"], **touched)
                )
            else:
                self._record_run(conn, runs, workspace_id, event)
                conn.execute(update(workspaces).where(key).values(**touched))

    @staticmethod
    def _record_run(conn: Connection, runs: Table, workspace_id: str, event: RecordedEvent) -> None:
        run_id = event.data["run_id"]
        key = (runs.c.workspace_id == workspace_id) & (runs.c.run_id == run_id)
        current = conn.execute(select(runs.c.fields).where(key)).scalar_one_or_none()
        if current is None:
            conn.execute(
                insert(runs).values(
                    workspace_id=workspace_id,
                    run_id=run_id,
                    seq=event.version,
                    fields=event.data["fields"],
                    recorded_at=event.recorded_at,
                )
            )
        else:
            merged = {**current, **event.data["fields"]}
            conn.execute(update(runs).where(key).values(fields=merged))


register_projection(WorkspaceProjection())


def scaffold_workspace(
    store: Store, workspace_id: str, /, *, skills: Any, prompts: Any, **fields: Any
) -> None:
    """Create the workspace with its skills, prompts and any other manifest fields.

    Raises WorkspaceExistsError if it exists, DomainInputError on bad input (nothing written).
    """
    check_id("workspace_id", workspace_id)
    data = {
        "skills": skills,
        "prompts": prompts,
        "fields": check_fields("fields", fields, _NOT_FIELDS),
    }
    event = validated(Scaffolded, data, f"scaffold_workspace({workspace_id!r})")
    try:
        store.append(
            stream_id(STREAM, workspace_id),
            [NewEvent(SCAFFOLDED, event.model_dump())],
            expected_version=0,
        )
    except ConcurrencyError as e:
        raise WorkspaceExistsError(f"workspace {workspace_id!r} exists already") from e


def update_manifest(store: Store, workspace_id: str, /, **changes: Any) -> None:
    """Set manifest fields (skills, prompts or any other); unknown workspace -> error."""
    if not changes:
        raise DomainInputError("update_manifest needs at least one change")
    data = {"changes": check_fields("changes", changes, MANIFEST_KEYS)}
    event = validated(ManifestUpdated, data, f"update_manifest({workspace_id!r})")
    _append(store, workspace_id, NewEvent(MANIFEST_UPDATED, event.model_dump()))


def record_run(store: Store, workspace_id: str, run_id: str, /, **fields: Any) -> None:
    """Record a run in the workspace; recording it again merges the new fields over the old."""
    check_id("run_id", run_id)
    data = {"run_id": run_id, "fields": check_fields("fields", fields, _RUN_KEYS)}
    event = validated(RunRecorded, data, f"record_run({workspace_id!r}, {run_id!r})")
    # A workspace lists runs this store holds: a dangling id would point at nothing.
    _append(store, workspace_id, NewEvent(RUN_RECORDED, event.model_dump()), run_id=run_id)


def update_best(store: Store, workspace_id: str, /, **fields: Any) -> None:
    """Replace the workspace's best (e.g. run_id, epoch, score) with `fields`."""
    if not fields:
        raise DomainInputError("update_best needs at least one field")
    data = {"fields": check_fields("fields", fields, frozenset())}
    event = validated(BestUpdated, data, f"update_best({workspace_id!r})")
    _append(store, workspace_id, NewEvent(BEST_UPDATED, event.model_dump()))


def get_manifest(store: Store, workspace_id: str) -> dict[str, Any]:
    """The manifest: its fields, `runs` (each with `recorded_at`), `best`, `created_at`,
    `updated_at` (aware UTC datetimes, as everywhere in the read API; `export_manifest` writes
    them as ISO 8601) and the stream version."""
    check_id("workspace_id", workspace_id)
    with store.query(PROJECTION) as (conn, tables):
        workspaces, runs = tables["workspaces"], tables["runs"]
        row = conn.execute(
            select(workspaces).where(workspaces.c.workspace_id == workspace_id)
        ).first()
        if row is None:
            raise UnknownWorkspaceError(f"no workspace {workspace_id!r}")
        run_rows = conn.execute(
            select(runs).where(runs.c.workspace_id == workspace_id).order_by(runs.c.seq)
        ).all()
    return {
        **row.fields,
        "workspace_id": workspace_id,
        "runs": [
            {**r.fields, "run_id": r.run_id, "recorded_at": as_utc(r.recorded_at)} for r in run_rows
        ],
        "best": row.best,
        "created_at": as_utc(row.created_at),
        "updated_at": as_utc(row.updated_at),
        "version": row.version,
    }


_NOT_FIELDS = MANIFEST_KEYS | {"skills", "prompts"}
_RUN_KEYS = frozenset({"run_id", "recorded_at"})


def _append(store: Store, workspace_id: str, event: NewEvent, *, run_id: str | None = None) -> None:
    """Append to an existing workspace (workspaces and runs are never deleted, so checks
    suffice); with `run_id`, that run must be registered too."""
    check_id("workspace_id", workspace_id)
    with store.query(PROJECTION) as (conn, tables):
        workspaces = tables["workspaces"]
        found = conn.execute(
            select(workspaces.c.version).where(workspaces.c.workspace_id == workspace_id)
        ).first()
    if found is None:
        raise UnknownWorkspaceError(f"no workspace {workspace_id!r}: scaffold it first")
    if run_id is not None:
        require_run(store, run_id)
    store.append(stream_id(STREAM, workspace_id), [event])
