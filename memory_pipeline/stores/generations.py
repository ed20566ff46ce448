"""Table generations: a model change never mixes vectors, and search never goes dark.

Each embedding identity (provider, model, dims, provider key) gets its own LanceDB
table, a *generation*. A pointer file, ``data_dir/generations.json`` (written whole: a temp
file renamed under a lock on disk, a conditional PUT on object storage, so concurrent
writers on any machine never lose each other's change), names the ``current`` generation,
the one searches read, and the one being ``building`` when the configured identity changed.
Index runs write to the generation of the configured identity; when that one is building
and every file is in it, the pointer switches in one write. A run that changes nothing
writes nothing. Previous generations stay (``memory generations``) for ``rollback`` until
``prune``; tables are dropped only after the pointer that no longer names them is written.

The first generation keeps the configured ``table_name``; later ones are
``<table_name>__g<N>``. An index built before generations existed (a table, no
pointer) is adopted as the current generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from memory_pipeline import storage
from memory_pipeline.errors import StoreError
from memory_pipeline.settings import Settings
from memory_pipeline.stores.lance import VectorStore

POINTER = "generations.json"
T = TypeVar("T")
IDENTITY_KEYS = ("provider", "model", "dims", "provider_key")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _empty() -> dict:
    return {"current": None, "building": None, "previous": [], "generations": {}}


def load(settings: Settings) -> dict:
    """The pointer as it is on disk (an empty one when there is none yet)."""
    data = storage.of(settings)
    try:
        text = data.read_text(storage.GENERATIONS)
        return _empty() if text is None else _empty() | json.loads(text)
    except (OSError, ValueError) as err:
        raise StoreError(f"cannot read the generation pointer {data.where(storage.GENERATIONS)}: {err}") from err


def _update(settings: Settings, change: Callable[[dict, list[str]], T]) -> T:
    """Apply ``change(state, drops)`` to the pointer without losing a concurrent writer's change
    (parallel partition runs, here or on other machines, share it: ``DataStore.update_json``);
    the tables ``change`` lists in ``drops`` are dropped once the new pointer is written."""
    data = storage.of(settings)
    drops: list[str] = []

    def apply(state: dict) -> T:
        drops.clear()  # applied again when another writer got there first
        return change(state, drops)

    try:
        result = data.update_json(storage.GENERATIONS, apply, _empty)
    except ValueError as err:
        raise StoreError(f"cannot read the generation pointer {data.where(storage.GENERATIONS)}: {err}") from err
    for name in drops:
        _drop(settings, name)
    return result


def _same(record: dict, meta: dict) -> bool:
    return all(record.get(k) == meta.get(k) for k in IDENTITY_KEYS)


def _adopt_legacy(settings: Settings, state: dict) -> None:
    """A table from before generations (or a first run): make it generation 1."""
    if state["current"] is not None:
        return
    store = VectorStore(storage.of(settings).lancedb_uri, settings.table_name)
    if store.exists():
        meta = store.meta()
        state["generations"][settings.table_name] = {k: meta.get(k) for k in IDENTITY_KEYS} | {
            "number": 1, "created_at": _now(), "adopted": True,
        }  # fmt: skip
        state["current"] = settings.table_name


def write_target(settings: Settings, meta: dict) -> tuple[str, bool]:
    """The table an index run with this identity writes to, and whether it is a building generation."""
    return _update(settings, lambda state, drops: _write_target(settings, meta, state, drops))


def _write_target(settings: Settings, meta: dict, state: dict, drops: list[str]) -> tuple[str, bool]:
    _adopt_legacy(settings, state)
    gens = state["generations"]
    if state["current"] is None:
        gens[settings.table_name] = {k: meta[k] for k in IDENTITY_KEYS} | {"number": 1, "created_at": _now()}
        state["current"] = settings.table_name
        return settings.table_name, False
    if _same(gens[state["current"]], meta):
        return state["current"], False
    building = state["building"]
    if building and _same(gens[building], meta):
        return building, True
    # Numbers only grow (an abandoned build's number is not reused), so a name is never ambiguous.
    number = max([state.get("last_number", 1), *(g.get("number", 1) for g in gens.values())]) + 1
    state["last_number"] = number
    if building:  # a rebuild for an identity nobody wants any more: never served, dropped
        drops.append(building)
        gens.pop(building, None)
    # Numbers are never handed out twice (last_number is part of the same write), so the
    # new name holds no table: nothing to drop before it is written.
    name = f"{settings.table_name}__g{number}"
    gens[name] = {k: meta[k] for k in IDENTITY_KEYS} | {"number": number, "created_at": _now()}
    state["building"] = name
    return name, True


def table_for(settings: Settings, meta: dict) -> str:
    """The generation holding this identity (building or current), else the current one; creates nothing."""
    state = load(settings)
    for name in (state["building"], state["current"]):
        if name and _same(state["generations"][name], meta):
            return name
    return state["current"] or settings.table_name


def holds_identity(settings: Settings, meta: dict) -> bool:
    """Whether a generation of this identity is current or building (else a run creates one). Records
    that say a file is indexed for this identity then describe a table that is not served or built
    any more: one rolled back from, or an abandoned build (a legacy table, no pointer: counts)."""
    state = load(settings)
    if not state["current"]:
        return True
    return any(name and _same(state["generations"][name], meta) for name in (state["building"], state["current"]))


def current(settings: Settings) -> tuple[str, dict]:
    """The table searches read and its identity record (a legacy table is read as it is)."""
    state = load(settings)
    if state["current"]:
        return state["current"], state["generations"][state["current"]]
    meta = VectorStore(storage.of(settings).lancedb_uri, settings.table_name).meta()
    return settings.table_name, {k: meta.get(k) for k in IDENTITY_KEYS}


def switch(settings: Settings, name: str) -> dict:
    """Make the building generation ``name`` current in one step; the old one becomes previous."""
    return _update(settings, lambda state, drops: _switch(state, name))


def _switch(state: dict, name: str) -> dict:
    if state["building"] != name:
        return state
    old = state["current"]
    state["current"], state["building"] = name, None
    state["generations"][name]["switched_at"] = _now()
    if old and old not in state["previous"]:
        state["previous"].insert(0, old)
    return state


def rollback(settings: Settings) -> dict:
    """Serve the most recent previous generation again (the current one becomes previous)."""
    return _update(settings, lambda state, drops: _rollback(state))


def _rollback(state: dict) -> dict:
    if not state["previous"]:
        raise StoreError("no previous generation to roll back to")
    target = state["previous"].pop(0)
    old = state["current"]
    state["current"] = target
    if old:
        state["previous"].insert(0, old)
    return state


def prune(settings: Settings) -> list[str]:
    """Drop every previous generation's table; returns their names."""

    def change(state: dict, drops: list[str]) -> list[str]:
        drops.extend(state["previous"])
        for name in drops:
            state["generations"].pop(name, None)
        state["previous"] = []
        return list(drops)

    return _update(settings, change)


def _drop(settings: Settings, name: str) -> None:
    store = VectorStore(storage.of(settings).lancedb_uri, name)
    if store.exists():
        store.db.drop_table(name)


def describe(settings: Settings) -> dict:
    """Every generation with its role and row count, for `status` and `memory generations`."""
    state = load(settings)
    out = []
    for name, rec in sorted(state["generations"].items(), key=lambda kv: kv[1].get("number", 0)):
        role = "current" if name == state["current"] else "building" if name == state["building"] else "previous"
        store = VectorStore(storage.of(settings).lancedb_uri, name)
        out.append({"table": name, "role": role, "rows": store.count_rows() if store.exists() else 0} | rec)
    return {"current": state["current"], "building": state["building"], "previous": state["previous"], "generations": out}
