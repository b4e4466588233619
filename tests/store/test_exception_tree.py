"""The tree drawn in `trm_store.errors`'s docstring is exactly the package's StoreError classes."""

from __future__ import annotations

import importlib
import pkgutil
import re

import trm_store
from trm_store import errors
from trm_store.errors import StoreError

BRANCH = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def drawn_tree() -> dict[str, str]:
    """Class name -> its parent's name, as the docstring draws them."""
    lines = (errors.__doc__ or "").splitlines()
    root = next(i for i, line in enumerate(lines) if line.startswith("StoreError "))
    parents: dict[str, str] = {}
    path = ["StoreError"]
    for line in lines[root + 1 :]:
        match = BRANCH.match(line)
        if match is None:
            if line.strip().strip("│").strip():
                break  # the end of the drawing
            continue
        depth = len(match["indent"]) // 5 + 1
        del path[depth:]
        parents[match["name"]] = path[depth - 1]
        path.append(match["name"])
    return parents


def defined_tree() -> dict[str, str]:
    """Every StoreError subclass defined in `trm_store` (all modules imported), by its parent."""
    for module in pkgutil.walk_packages(trm_store.__path__, "trm_store."):
        if not module.name.endswith(".__main__"):  # running it would run the CLI
            importlib.import_module(module.name)
    found: dict[str, str] = {}
    todo = [StoreError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("trm_store.") and not sub.__name__.startswith("_"):
                found[sub.__name__] = cls.__name__
                todo.append(sub)
    return found


def test_the_drawn_tree_is_the_defined_tree() -> None:
    assert drawn_tree() == defined_tree()


def test_every_public_error_of_the_core_is_in_the_tree() -> None:
    drawn = drawn_tree()
    assert {name for name in errors.__all__ if name != "StoreError"} <= set(drawn)


def test_every_store_error_survives_a_pickle_round_trip() -> None:
    """Errors cross processes (the sink's child writer answers with them): each comes back as
    itself, its attributes and message kept. Those taking a message alone are built with one;
    those with their own arguments are listed here."""
    import pickle

    from trm_store.domain.errors import InfraOutcomeError
    from trm_store.errors import ConcurrencyError, EventIdConflictError

    own_arguments: dict[type[StoreError], StoreError] = {
        ConcurrencyError: ConcurrencyError("run:r1", 3, 5),
        EventIdConflictError: EventIdConflictError("id-1", "run:r1", 2, "another stream"),
        InfraOutcomeError: InfraOutcomeError("snap", "u1", ["q1", "q2"]),
    }
    defined_tree()  # imports every module, so every subclass is known
    classes = [StoreError, *_subclasses(StoreError)]
    for cls in classes:
        error = own_arguments.get(cls) or cls("a message")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and str(back) == str(error)
        assert vars(back) == vars(error)


def _subclasses(cls: type[StoreError]) -> list[type[StoreError]]:
    direct = cls.__subclasses__()
    return [c for d in direct for c in (d, *_subclasses(d))]
