"""`memory doctor`: check the configuration, each configured provider, the table and the cache.

Every check says ``ok``, ``warn`` or ``fail`` with what it found and, when it is not ok,
what to do. Each provider in play (the primary or auto's pick, and the fallback) makes
one real test embedding. Nothing here prints or stores an API key: only the names of
the environment variables it looked at.
"""

from __future__ import annotations

import os
import sqlite3
import time

from memory_pipeline import storage
from memory_pipeline.errors import ConfigError, MemoryPipelineError, ProviderError
from memory_pipeline.settings import REMOTE_PROVIDERS, Settings, load_settings

PROBE_TEXT = "memory doctor: a short test sentence to embed"


_UNLOCKED_FIX = (
    "run `memory doctor` as the user who owns the data folder (a run of theirs may have been writing it); if it says the same, delete the file there"
)


def _check(name: str, status: str, detail: str, fix: str = "", **extra) -> dict:
    return {"name": name, "status": status, "detail": detail, "fix": fix, **extra}


def run_doctor(config: str | None) -> dict:
    """All checks, in order; ``ok`` is false when any check failed."""
    checks: list[dict] = []
    try:
        settings = load_settings(config)
    except ConfigError as err:
        checks.append(_check("config", "fail", str(err), err.hint))
        return {"ok": False, "checks": checks}
    checks.append(_check("config", "ok", f"{settings.config_path} is valid"))
    checks += _sources(settings)
    checks += _keys()
    checks += _providers(settings)
    checks += _table(settings)
    checks.append(_cache(settings))
    return {"ok": all(c["status"] != "fail" for c in checks), "checks": checks}


def _sources(settings: Settings) -> list[dict]:
    from memory_pipeline.discovery import missing_sources

    missing = dict((src.name, why) for src, why in missing_sources(settings))
    return [
        _check(f"source {src.name}", "warn", f"{src.path} {missing[src.name]} (its rows are kept)", "mount the disk or fix sources[].path")
        if src.name in missing
        else _check(f"source {src.name}", "ok", str(src.path))
        for src in settings.sources
    ]


def _keys() -> list[dict]:
    from memory_pipeline.providers.registry import provider_class

    found = []
    for name in REMOTE_PROVIDERS:
        try:
            env_keys = provider_class(name).env_keys
        except ProviderError:
            continue
        found += [k for k in env_keys if os.environ.get(k)]
    return [_check("api keys", "ok", f"set in the environment: {', '.join(found) or 'none'}")]


def _probe(label: str, provider) -> dict:
    started = time.perf_counter()
    try:
        vec = provider.embed_query(PROBE_TEXT)
    except MemoryPipelineError as err:
        return _check(label, "fail", str(err), err.hint or "see the provider's message above")
    ms = (time.perf_counter() - started) * 1000
    if vec.shape[-1] != provider.dims:
        return _check(label, "fail", f"test vector has {vec.shape[-1]} dims, expected {provider.dims}", "check model and dims")
    where = getattr(provider, "base_url", "") or "this machine"
    return _check(label, "ok", f"{provider.name}/{provider.model}: test embedding of {provider.dims} dims in {ms:.0f} ms ({where})")


def _providers(settings: Settings) -> list[dict]:
    from memory_pipeline.providers.registry import (
        build_provider,
        clear_primary_failure,
        primary_failure,
        resolve_provider,
    )

    out = []
    failed = primary_failure(settings)
    if settings.provider == "none":
        return [_check("provider", "ok", "none: full-text search only (as configured)")]
    # The primary (or auto's pick), tried even when a recorded failure has put the fallback in charge.
    try:
        if settings.provider == "auto":
            primary = resolve_provider(settings)
            if primary.provider is None:
                out.append(_check("provider", "warn", primary.reason, "install the local model or export a provider's API key"))
            elif primary.fallback_from:
                out.append(_check("provider", "warn", primary.reason))
            else:
                out.append(_probe(f"provider (auto: {primary.provider.name})", primary.provider))
        else:
            out.append(_probe(f"provider {settings.provider}", build_provider(settings.provider, settings)))
    except MemoryPipelineError as err:
        out.append(_check(f"provider {settings.provider}", "fail", str(err), err.hint))
    if failed is not None:
        if out[-1]["status"] == "ok":
            clear_primary_failure(settings)
            out.append(_check("fallback state", "ok", f"{failed['provider']} works again; cleared its failure of {failed['at']}",
                              "the next `memory index` builds with the primary again"))  # fmt: skip
        else:
            out.append(_check("fallback state", "warn", f"{failed['provider']} failed permanently at {failed['at']}: {failed['reason']}"))
    if settings.fallback:
        try:
            out.append(_probe(f"fallback {settings.fallback}", build_provider(settings.fallback, settings, primary=False)))
        except MemoryPipelineError as err:
            out.append(_check(f"fallback {settings.fallback}", "fail", str(err), err.hint))
    return out


def _table(settings: Settings) -> list[dict]:
    from memory_pipeline.stores import generations
    from memory_pipeline.stores.lance import FTS_COLUMN, VectorStore

    try:
        info = generations.describe(settings)
        name, record = generations.current(settings)
        store = VectorStore(storage.of(settings).lancedb_uri, name)
        table = store.open()  # None while no table exists
        if table is None:
            return [_check("table", "warn", f"no table at {storage.of(settings).lancedb_uri} yet", "run `memory index`")]
        rows = store.count_rows()
        out = [_check("table", "ok", f"{name}: {rows} rows, {record.get('provider')}/{record.get('model')} ({store.dims()} dims)")]
        indices = {idx.name for idx in table.list_indices()}
        if rows and f"{FTS_COLUMN}_idx" not in indices:
            out.append(_check("full-text index", "warn", "missing", "run `memory index` (it creates the index)"))
        else:
            out.append(_check("full-text index", "ok", "present" if rows else "empty table"))
        from memory_pipeline.stages.report import indexed_by_source, records_match_table

        _, recorded, fingerprints = indexed_by_source(settings)
        mismatch = records_match_table(settings, rows, recorded, fingerprints)
        if mismatch:
            out.append(_check("index records", "fail", mismatch, "run `memory index`: it compares them file by file and repairs the table"))
        if info["building"]:
            b = next(g for g in info["generations"] if g["table"] == info["building"])
            out.append(_check("generation", "warn", f"{b['table']} for {b['provider']}/{b['model']} is being built ({b['rows']} rows so far); searches use {name}",
                              "run `memory index`: it switches once every file is in it; files it waits for (that cannot be read, or fail) are "
                              "listed by `memory index --json` in generation_waits_for: fix or delete them"))  # fmt: skip
        if info["previous"]:
            out.append(
                _check("generations", "ok", f"{len(info['previous'])} previous generation(s) kept for rollback", "`memory generations prune` frees them")
            )
        return out
    except MemoryPipelineError as err:
        return [_check("table", "fail", str(err), err.hint)]
    except Exception as err:  # noqa: BLE001 - lancedb raises its own types for a damaged table
        return [_check("table", "fail", f"cannot open the table: {type(err).__name__}: {err}", "run `memory index --force` to rebuild")]


def _cache(settings: Settings) -> dict:
    if not settings.cache.enabled:
        return _check("cache", "ok", "disabled (cache.enabled: false)")
    from memory_pipeline.stores.cache import damaged, open_readonly

    path = storage.of(settings).cache_path
    try:
        if not path.is_file():
            return _check("cache", "ok", f"empty (created by the first index run at {path})")
    except OSError as err:  # a folder on the way this user cannot enter
        return _check("cache", "fail", f"{path}: {err.strerror or err}", f"check the permissions of {path.parent} and the folders above it")
    # Where this user cannot write the folder, the cache is read as it is on disk (SQLite's
    # ``immutable``): a run of the user who owns it may be half-way through a write, which reads as
    # damage. Deleting it is then for its owner to decide, after a check of their own.
    unlocked = not os.access(path.parent, os.W_OK)
    try:
        conn = open_readonly(path)
        try:
            ok = conn.execute("PRAGMA quick_check").fetchone()[0]
            entries = conn.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as err:
        if damaged(err) and unlocked:
            return _check("cache", "fail", f"{path}: {err} (read without locks: its folder is read-only to this user)", _UNLOCKED_FIX)
        if damaged(err):
            return _check("cache", "fail", f"{path}: {err}", "delete the file: vectors are recomputed on the next run")
        # Locked, unreadable, a failing disk: the cache may be fine; deleting it would not help.
        return _check(
            "cache", "fail", f"{path}: {err}", f"check the permissions and the disk of {path.parent}, and that no other process holds the file locked"
        )
    if ok != "ok":
        if unlocked:
            return _check("cache", "fail", f"{path}: integrity check says {ok} (read without locks: its folder is read-only to this user)", _UNLOCKED_FIX)
        return _check("cache", "fail", f"{path}: integrity check says {ok}", "delete the file: vectors are recomputed on the next run")
    status = "warn" if entries > settings.cache.max_entries else "ok"
    return _check("cache", status, f"{entries} entries (max {settings.cache.max_entries})", "" if status == "ok" else "the next run prunes it")
