"""What `append_prepared` checks of each event it is given: that it is one `Store.prepare` could
have made, and, unless this process's `prepare` made it as it is now, that its type's model
makes its data (the log keeps forever what is written)."""

from __future__ import annotations

from trm_store.errors import EventValidationError
from trm_store.event_ids import check_event_id
from trm_store.event_types import registered_event_type, type_name_problem
from trm_store.json_codec import dumps_json, loads_json
from trm_store.prepared import PreparedEvent, copied, sealed_as
from trm_store.vocabulary import INT32_MAX, count_problem, exact_int, exact_text

__all__ = ["as_prepared"]


def as_prepared(given: PreparedEvent) -> PreparedEvent:
    """A copy of `given` (each field read once), checked: EventValidationError unless it is one
    `prepare` could have made: a type name, a schema version, an event id as `prepare` writes
    it, data and meta dicts whose canonical JSON is the text to be written (a changed field, or
    text that is no JSON, would be kept in the log, and read back, or fail to be read, ever
    after). The copy is what is written: code that runs while the check encodes (a `dict`
    subclass nested in the meta) cannot change a field of it after its check, and its data and
    meta are decoded from the checked text. Costs an encode and a decode of its data and meta.

    An event this process's `prepare` made and nobody changed since (its seal matches) is not
    validated again: its type need not be registered here at that schema version still (a
    writer that buffered events across an upgrade: the log upcasts them when read). Any other
    (a field and its JSON changed together, a type renamed, an event built by hand or prepared
    in another process) is validated again, as `append` would, if its type is registered here:
    at its schema version, else refused, since its data cannot be checked. One whose type this
    process never registered is written as its JSON says (another process prepared it; no
    projection here takes it)."""
    seal = given.seal
    event = copied(given)
    event.type, event.event_id = exact_text(event.type), exact_text(event.event_id)
    event.schema_version = exact_int(event.schema_version)
    what = f"prepared event {event.event_id!r}"
    problem = type_name_problem(event.type) or count_problem(event.schema_version, 1, INT32_MAX)
    if problem is not None:
        raise EventValidationError(f"{what}: its type or schema version {problem}")
    if check_event_id(event.event_id) != event.event_id:
        raise EventValidationError(f"{what}: its id is not as Store.prepare wrote it")
    texts = []
    for name, value, text in (
        ("data", event.data, event.data_json),
        ("meta", event.meta, event.meta_json),
    ):
        written = dumps_json(value, what=f"{what} {name}") if type(value) is dict else None
        if written is None or written != exact_text(text):
            raise EventValidationError(f"{what}: its {name} changed since Store.prepare made it")
        texts.append(written)  # the encoder's own text: what was checked
    event.data_json, event.meta_json = texts
    if seal is None or seal != sealed_as(event):
        _validated_again(event, what)
    # What is returned and given to the projections is what the log holds: decoded from the
    # checked text, not the caller's dicts, whose values may encode alike and differ (an int
    # subclass), or change after their check (code run by the meta's encoding).
    event.data, event.meta = loads_json(event.data_json), loads_json(event.meta_json)
    return event


def _validated_again(event: PreparedEvent, what: str) -> None:
    """Check `event`'s data as `append` would check it, against its type registered here at its
    schema version: the model's normal form of its data must be the text written."""
    registered = registered_event_type(event.type)
    if registered is None:
        return
    if registered.schema_version != event.schema_version:
        raise EventValidationError(
            f"{what} is not as this process's Store.prepare left it, and its type "
            f"{event.type!r} is registered here at schema version {registered.schema_version}, "
            f"not {event.schema_version}: it cannot be checked"
        )
    normal = registered.validate(event.data)
    if dumps_json(normal, what=f"{what} data") != event.data_json:
        raise EventValidationError(
            f"{what}: its data is not what the model of {event.type!r} makes of it"
        )
