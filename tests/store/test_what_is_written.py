"""What an append returns and hands to the projections is what the log holds (review, nineteenth
session): meta as it reads back, a prepared event written only as `prepare` left it (and written
when it is: from another process, across a schema upgrade), and a cyclic meta refused even when
the recursion limit is raised. On a SQLite file and on PostgreSQL."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Connection, MetaData, String, Table

from tests.store.helpers import Added, added
from trm_store import (
    EventValidationError,
    NewEvent,
    PreparedEvent,
    Projection,
    RecordedEvent,
    Store,
    open_store,
    register_event_type,
)


class MetaKinds(Projection):
    """Per event: the Python type of its meta's `tags`, as `apply` was given it."""

    name = "test_meta_kinds"
    version = 1
    event_types = frozenset({"test.added"})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {
            "kinds": Table(
                f"test_meta_kinds{suffix}",
                metadata,
                Column("event_id", String(36), primary_key=True),
                Column("tags", String(20), nullable=False),
            )
        }

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        rows = [{"event_id": e.event_id, "tags": type(e.meta.get("tags")).__name__} for e in events]
        conn.execute(tables["kinds"].insert(), rows)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url, projections={MetaKinds.name: MetaKinds()}) as s:
        yield s


def test_meta_is_returned_and_projected_as_the_log_holds_it(store: Store) -> None:
    """A tuple reads back as a list and an int key as a string: the append's answer, a retry's
    and the projection's row say the same, and a rebuild makes the same rows."""

    def meta() -> dict[str, Any]:
        return {"tags": ("x", "y"), "by": {1: "one"}, "nested": ["a"]}

    event_id = "6f1c52a6-0b5e-4a43-9d1c-7a3c4a3d6a10"
    given = meta()
    (first,) = store.append("s", [added(1, meta=given, event_id=event_id)])
    given["nested"].append("changed by the caller after the append")
    (read,) = store.read_stream("s")
    assert first == read
    assert first.meta["tags"] == ["x", "y"] and first.meta["by"] == {"1": "one"}
    assert first.meta["nested"] == ["a"]
    assert store.append("s", [added(1, meta=meta(), event_id=event_id)]) == [first]
    assert store.verify_projections() == []
    with store.query(MetaKinds.name) as (conn, tables):
        assert [r.tags for r in conn.execute(tables["kinds"].select())] == ["list"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: dataclasses.replace(p, data_json='{"amount": 1'), "data changed"),
        (lambda p: dataclasses.replace(p, data={"amount": 2}), "data changed"),
        (lambda p: dataclasses.replace(p, data=[1]), "data changed"),
        (lambda p: dataclasses.replace(p, meta_json="{}"), "meta changed"),
        (lambda p: dataclasses.replace(p, type=""), "type or schema version must be 1..128"),
        (lambda p: dataclasses.replace(p, type="a\x00b"), "type or schema version"),
        (lambda p: dataclasses.replace(p, schema_version=0), "type or schema version"),
        (lambda p: dataclasses.replace(p, schema_version=2**31), "type or schema version"),
        (lambda p: dataclasses.replace(p, event_id="not-an-id"), "not a UUID"),
        (lambda p: dataclasses.replace(p, event_id=p.event_id.upper()), "id is not as"),
        (lambda p: _mutated(p), "data changed"),
    ],
    ids=[
        "json-text",
        "data",
        "data-not-a-dict",
        "meta-text",
        "type-empty",
        "type-nul",
        "schema-version-0",
        "schema-version-too-big",
        "id",
        "id-spelling",
        "data-mutated",
    ],
)
def test_a_prepared_event_changed_since_prepare_is_refused(
    store: Store, change: Callable[[PreparedEvent], PreparedEvent], message: str
) -> None:
    """The log keeps what is written: text that is no JSON would fail every later read of it
    (review: `read_all` raised JSONDecodeError from then on, on SQLite)."""
    prepared = store.prepare(added(1))
    with pytest.raises(EventValidationError, match=message):
        store.append_prepared("s", [store.prepare(added(2)), change(prepared)])
    assert store.head_position() == 0
    assert store.append_prepared("s", [store.prepare(added(3))]) == list(store.read_all())


def _mutated(prepared: PreparedEvent) -> PreparedEvent:
    prepared.data["amount"] = 99
    return prepared


def test_a_cyclic_meta_is_refused_with_the_recursion_limit_raised(tmp_path: Any) -> None:
    """ML code raises the recursion limit; the C encoder then recursed past the C stack on a
    cyclic meta and the process died (SIGSEGV) instead of raising."""
    script = (
        "import sys\n"
        "from tests.store.helpers import added\n"
        "from trm_store import EventValidationError, open_store\n"
        "sys.setrecursionlimit(200_000)\n"
        "meta = {'loop': []}\n"
        "meta['loop'].append(meta)\n"
        f"with open_store('sqlite:///{tmp_path}/cyclic.db') as store:\n"
        "    try:\n"
        "        store.append('s', [added(1, meta=meta)])\n"
        "    except EventValidationError as e:\n"
        "        print('refused:', e)\n"
        "    print('events:', store.head_position())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "meta is not JSON: nested deeper than" in done.stdout
    assert "events: 0" in done.stdout


def test_a_prepared_event_is_written_as_prepared_whatever_this_process_knows(
    store_url: str, tmp_path: Path
) -> None:
    """Prepared at schema version 1, with meta whose keys are ints: written by a process that
    never registered the type, and here after the type moved to version 2 (the log upcasts it
    when read). Each read back as `append_prepared` returned it (the second review of the
    nineteenth session: each was refused)."""
    register_event_type("test.buffered", Added)
    with open_store(store_url, projections={}) as store:
        meta = {"by": {2: "a", 10: "b"}}
        elsewhere, here = (
            [store.prepare(NewEvent("test.buffered", {"amount": n}, meta=meta))] for n in (1, 2)
        )
        (tmp_path / "prepared.pickle").write_bytes(pickle.dumps(elsewhere))
        script = (
            "import pickle, sys\n"
            "from trm_store import open_store\n"
            "with open_store(sys.argv[1], projections={}) as store:\n"
            "    events = pickle.loads(open(sys.argv[2], 'rb').read())\n"
            "    print([e.position for e in store.append_prepared('s', events)])\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, store_url, str(tmp_path / "prepared.pickle")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.stdout.strip() == "[1]", done.stderr[-2000:]
        register_event_type("test.buffered", Added, schema_version=2, upcast=lambda _v, d: d)
        written = store.append_prepared("s", here)
        assert [(e.schema_version, e.data["amount"]) for e in written] == [(1, 2)]
        assert [e.meta["by"] for e in store.read_stream("s")] == [{"2": "a", "10": "b"}] * 2
