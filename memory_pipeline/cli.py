"""The `memory` command: index, search, eval, scan, status, analytics.

Exit codes: 0 success, 1 an error (one line on stderr saying what to do),
2 a usage error. Files that could not be indexed do not make `index` fail:
they are listed with their reasons (and the run still indexes everything else).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
from collections import Counter
from collections.abc import Iterator
from typing import NoReturn

from memory_pipeline.display import shown
from memory_pipeline.errors import MemoryPipelineError


class UsageError(MemoryPipelineError):
    """A command line that cannot work as given (exit 2)."""


INTERRUPTED = "interrupted; run the same command again to resume"


def _settings(args):
    from memory_pipeline.settings import load_settings

    args.loaded_settings = load_settings(args.config)  # main names its data folder if its disk fails
    return args.loaded_settings


class OutputFailed(Exception):
    """Standard output cannot be written (closed, a full disk, an I/O error): exit 120, as
    Python's own exit gives for output it cannot flush."""


_JSON_PRINTED = False  # whether this command has printed its JSON object (main prints one on failure if not)


def _print_json(obj) -> None:
    global _JSON_PRINTED
    text = json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n"
    if sys.stdout is None:  # the process was started with stdout closed (`>&-`)
        raise OutputFailed("standard output is closed")
    try:
        _JSON_PRINTED = True
        sys.stdout.write(text)
        sys.stdout.flush()  # now, so that a failure is told apart from one of the data folder's disk
    except BrokenPipeError:
        raise
    except OSError as err:
        raise OutputFailed(err) from err


class _GuardedOutput:
    """``sys.stdout`` while a command runs: a write or flush that fails (a full disk, an I/O error,
    a closed descriptor) raises :class:`OutputFailed`, so plain-text output that cannot be written
    midway exits 120 with one line, as ``--json`` output does, and is not taken for an error of the
    data folder's disk (exit 1). A broken pipe stays a broken pipe (the reader left: exit 0)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputFailed(err) from err

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise OutputFailed(err) from err

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _drop_output() -> None:
    """Send what is left for stdout nowhere: it cannot be written, and the exit would try again."""
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# --- index -------------------------------------------------------------------------------


def cmd_index(args) -> int:
    from memory_pipeline import progress

    settings = None
    try:
        from memory_pipeline.runner import run_index
        from memory_pipeline.stages.hooks import NO_HOOKS

        settings = _settings(args)
        if not (args.json or args.quiet):
            progress.set_listener(progress.StderrProgress())
        summary = run_index(settings, force=args.force, hooks=getattr(args, "hooks", None) or NO_HOOKS)
    except (Exception, KeyboardInterrupt) as err:
        if args.json:
            # Agents parse stdout: a run that stops (or never starts: a bad config, Ctrl-C) still
            # says why, and which files failed so far.
            _print_json(_failed_run(settings, err))
        raise
    finally:
        progress.set_listener(None)
    _refresh_runs(settings)
    if summary["mode"] == "fts-only" and summary["requested_provider"] != "none":
        reason = summary["fallback_reason"] or "no embedding provider is available"
        print(f"[WARN] indexed for full-text search only: {shown(reason)}", file=sys.stderr)
    if args.json:
        _print_json({"ok": True, **summary})
        return 0
    if not args.quiet:
        print(
            f"Indexed {summary['files_seen']} files: {summary['files_changed']} changed, "
            f"{summary['files_deleted']} deleted; {summary['chunks_total']} chunks "
            f"({summary['chunks_embedded']} embedded, {summary['chunks_cached']} from cache); "
            f"{summary['rows_written']} rows written, {summary['rows_deleted']} deleted; "
            f"table has {summary['table_rows']} rows [{summary['provider']}/{summary['model']}, "
            f"{summary['dims']} dims] in {summary['seconds']:.1f}s"
        )
        for err in summary["errors"]:
            print(f"  {err['status']}: {shown(err['path'])}: {shown(err['reason'])}", file=sys.stderr)
        coverage = summary.get("coverage")
        if coverage is not None and coverage < settings.checks.min_coverage:
            print(
                f"[WARN] coverage {coverage:.3f} is below checks.min_coverage {settings.checks.min_coverage}: "
                "`memory analytics` lists the files not indexed and why",
                file=sys.stderr,
            )
        if summary.get("generation") == "building":
            waits = summary.get("generation_waits_for") or []
            print(
                f"[WARN] the new generation {summary['table']} is not complete; searches use the current one until it is"
                + (f": it waits for {', '.join(shown(w) for w in waits)} (fix or delete them, then run `memory index` again)" if waits else ""),
                file=sys.stderr,
            )
    return 0


def _refresh_runs(settings) -> None:
    """The run is in runs/history.jsonl now: put it in the analytics database's `runs` table too."""
    from memory_pipeline.stores.analytics import refresh_runs

    try:
        refresh_runs(settings)
    except Exception as err:  # noqa: BLE001 - the index is fine; only the analytics copy lags a run
        import logging

        logging.getLogger("memory_pipeline").warning("analytics `runs` table not updated: %s: %s", type(err).__name__, err)


def _failed_run(settings, err: BaseException) -> dict:
    """``index --json``'s object for a run that stopped (``settings`` None: the config did not load)."""
    from memory_pipeline.discovery import SHARD_KEYS
    from memory_pipeline.stages.report import run_errors

    errors = []
    if settings is not None:
        try:
            errors = run_errors(settings, SHARD_KEYS)
        except Exception:  # noqa: BLE001 - the records themselves may be what failed
            pass
    if isinstance(err, KeyboardInterrupt):
        return {"ok": False, "interrupted": True, "error": INTERRUPTED, "hint": "", "skipped_run": False, "errors": errors}
    from memory_pipeline.stores.cache import disk_failure

    disk = disk_failure(err)
    if isinstance(err, MemoryPipelineError):
        message = str(err)
    elif disk is not None:
        message = _disk_failed(settings, disk)
    elif isinstance(err, OSError):
        from memory_pipeline.storage import one_line

        message = one_line(f"{type(err).__name__}: {err}", 500)
    else:
        message = f"unexpected error: {type(err).__name__}: {err}"
    return {"ok": False, "error": message, "hint": getattr(err, "hint", ""), "skipped_run": False, "errors": errors}


# --- search ------------------------------------------------------------------------------


def _result_types(value: str) -> list[str]:
    """``--type image,audio``: a comma-separated list of result types (argparse type)."""
    from memory_pipeline.search.filters import RESULT_TYPES

    types = [t.strip().lower() for t in value.split(",") if t.strip()]
    bad = [t for t in types if t not in RESULT_TYPES]
    if bad or not types:
        raise argparse.ArgumentTypeError(f"invalid type {bad[0] if bad else value!r} (choose from {', '.join(RESULT_TYPES)})")
    return types


def _check_utf8(what: str, value: str | None) -> None:
    """A command-line argument that was not UTF-8 (Python keeps each bad byte as a lone surrogate,
    U+DC80..U+DCFF): a usage error naming the byte, before it reaches the tokenizer or LanceDB."""
    for at, char in enumerate(value or ""):
        if "\ud800" <= char <= "\udfff":
            byte = f"byte 0x{ord(char) - 0xDC00:02x}" if char >= "\udc80" else f"U+{ord(char):04X}"
            raise UsageError(f"{what} is not valid UTF-8 ({byte} at character {at + 1}): set the terminal to UTF-8 and type it again")


def cmd_search(args) -> int:
    for what, value in (("the query", args.query), ("--source", args.source), ("--path", args.path), *(("--modality", m) for m in args.modality or ())):
        _check_utf8(what, value)
    if args.since and args.until and args.since > args.until:
        raise UsageError(f"--since {args.since} is after --until {args.until}: no date is in that range")
    if not args.no_server:
        from memory_pipeline.service.client import remote_search

        # None: no server for this data folder, or it refused (the search below then says why).
        answer = remote_search(args, bold=sys.stdout.isatty())
        if answer is not None:
            if args.json:
                _print_json({"query": args.query, "results": answer["results"]})
            else:
                print(answer["text"] if answer["results"] else f"No relevant memories for {(args.query or answer['query'])!r}.")
            return 0
    from memory_pipeline.search import search

    settings = _settings(args)
    query = " ".join(p for p in (args.query, *_file_queries(args, settings)) if p and p.strip())
    media = _query_media(args, settings)
    if not query and not media:
        raise UsageError("give a query, --image FILE or --audio FILE")
    results = search(
        query,
        settings=settings,
        max_results=args.max_results,
        min_score=args.min_score,
        mode=args.mode,
        source=args.source,
        path_glob=args.path,
        types=[t for group in (args.type or []) for t in group],
        modality=args.modality or None,
        since=args.since,
        until=args.until,
        fusion=args.fusion,
        mmr=args.mmr,
        mmr_lambda=args.mmr_lambda,
        recency_half_life_days=args.recency_half_life,
        query_media=media,
    )
    if not results:
        _warn_if_nothing_indexed(settings)
    if args.json:
        _print_json({"query": args.query, "results": [r.to_json() for r in results]})
        return 0
    if not results:
        print(f"No relevant memories for {(args.query or query)!r}.")
        return 0
    from memory_pipeline.render import render_results

    # Bold on a terminal; **markdown** when piped (still readable, and agents parse it).
    marks = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("**", "**")
    print(render_results(results, marks))
    return 0


def _warn_if_nothing_indexed(settings) -> None:
    """An empty answer from a folder never indexed (or whose table is gone) is not "nothing relevant":
    say so on stderr (the answer and exit status stay those of an empty search)."""
    from memory_pipeline import storage
    from memory_pipeline.stores import generations
    from memory_pipeline.stores.lance import VectorStore

    try:
        table_name, _ = generations.current(settings)
        if VectorStore(settings.lancedb_uri, table_name).open() is not None:
            return
    except Exception:  # noqa: BLE001 - only a hint: the search itself has answered
        return
    print(f"[WARN] nothing is indexed at {storage.of(settings).location} yet: run `memory index` first", file=sys.stderr)


def _file_queries(args, settings) -> list[str]:
    """The derived text of ``--image`` / ``--audio`` files, used as query text (unless --retrieval-mode native).

    With native media vectors on, a file without text is fine: its own vector searches.
    """
    from memory_pipeline.querying import derived_query_text
    from memory_pipeline.service.retrieval import plan

    native = settings.multimodal.native and settings.multimodal.enabled
    if not _query_files(args) or not plan(args.retrieval_mode, native, field="--retrieval-mode")[0]:
        return []
    return [derived_query_text(path, expected, settings, allow_empty=native) for path, expected in _query_files(args)]


def _query_files(args) -> list[tuple[str, str]]:
    return [(path, expected) for path, expected in ((args.image, "image"), (args.audio, "audio")) if path]


def _query_media(args, settings) -> list[tuple[str, str]]:
    """(path, mime) of the files to embed natively for the query, when native media vectors are on."""
    from memory_pipeline.querying import query_file
    from memory_pipeline.service.retrieval import plan

    native = settings.multimodal.native and settings.multimodal.enabled
    if not _query_files(args) or not plan(args.retrieval_mode, native, field="--retrieval-mode")[1]:
        return []
    return [query_file(path, expected, settings)[:2] for path, expected in _query_files(args)]


# --- store -------------------------------------------------------------------------------


def cmd_store(args) -> int:
    from memory_pipeline.intake import store_file

    settings = _settings(args)
    done = store_file(settings, args.file, note=args.note, source_name=args.source)
    _refresh_runs(settings)
    if args.json:
        _print_json(done)
        return 0
    how = "copied to" if done["copied"] else "indexed in place:"
    print(f"Stored {args.file} ({done['mime_type']}): {how} {done['file']}")
    if done["note"]:
        print(f"Note saved in {done['note']}")
    run = done["run"]
    print(f"Indexed: {run['files_changed']} changed files, {run['chunks_total']} chunks; table has {run['table_rows']} rows")
    return 0


# --- serve / mcp -------------------------------------------------------------------------


def cmd_serve(args) -> int:
    from memory_pipeline.service.run import serve

    settings = _settings(args)
    svc = settings.service  # the config's `service:` section; a flag given on the command line wins
    serve(
        settings,
        host=args.host if args.host is not None else svc.host,
        port=args.port if args.port is not None else svc.port,
        assets_source=args.assets_source if args.assets_source is not None else svc.assets_source,
        cors_origins=tuple(args.cors_origin) if args.cors_origin else svc.cors_origins,
        log_level=args.log_level,
    )
    return 0


def cmd_mcp(args) -> int:
    from memory_pipeline.service.mcp_server import run_stdio

    run_stdio(_settings(args))
    return 0


# --- eval --------------------------------------------------------------------------------


def cmd_eval(args) -> int:
    from memory_pipeline.evaluation import EVAL_MODES, format_report, run_eval

    modes = [m for part in args.mode for m in part.split(",") if m]
    bad = [m for m in modes if m not in EVAL_MODES]
    if bad or not modes:
        print(f"[ERROR] --mode must be among {', '.join(EVAL_MODES)}, got {','.join(bad) or 'nothing'}", file=sys.stderr)
        return 2
    for flag in ("corpus", "queries", "qrels"):
        if not os.path.isfile(getattr(args, flag)):
            print(f"[ERROR] --{flag}: file not found: {getattr(args, flag)}", file=sys.stderr)
            return 2
    settings = _settings(args)
    report = run_eval(settings, args.corpus, args.queries, args.qrels, modes=modes, keep_dir=args.keep, log=None if args.json else _log_stderr)
    if args.json:
        _print_json(report)
    else:
        print(format_report(report))
    return 0


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- scan --------------------------------------------------------------------------------


def cmd_scan(args) -> int:
    from memory_pipeline.discovery import INDEXED_MODALITIES, MEDIA_MODALITIES, assess, missing_sources, utf8_problem, walk_all

    settings = _settings(args)
    files = []
    for f in walk_all(settings):
        # The index's own classifier, without hashing; then what extraction would find: text that is not UTF-8.
        facts = assess(f, settings, read_content=False)
        row = {
            "source": f.source,
            "path": f.abs_path,
            "size": f.size,
            "mime_type": facts.mime,
            "modality": facts.modality,
            "status": facts.status,
            "reason": facts.reason,
        }
        if row["status"] == "ok" and row["modality"] in INDEXED_MODALITIES:
            try:
                problem = utf8_problem(f.abs_path, settings.source(f.source).path)
            except OSError as err:
                problem = "permission denied" if isinstance(err, PermissionError) else f"cannot read: {err.strerror or err}"
            except MemoryPipelineError as err:
                problem = getattr(err, "reason", str(err))
            if problem:
                row["status"], row["reason"] = "failed", problem
        files.append(row)
    ok = [f for f in files if f["status"] == "ok"]
    n_text = sum(1 for f in ok if f["modality"] in INDEXED_MODALITIES)
    n_media = sum(1 for f in ok if f["modality"] in MEDIA_MODALITIES)
    problems = [f for f in files if f["status"] != "ok"]
    # A source folder that is not there (an unmounted disk, a typo) holds nothing: say so, or "Found 0" misleads.
    missing = [{"source": src.name, "path": str(src.path), "reason": why} for src, why in missing_sources(settings)]
    for m in missing:
        print(f"[WARN] source {shown(m['source'])}: {shown(m['path'])} {m['reason']}: nothing scanned there", file=sys.stderr)
    if args.json:
        _print_json({"files": files, "text_files": n_text, "media_files": n_media, "to_index": len(ok), "skipped": len(problems), "missing_sources": missing})
        return 0
    if args.verbose:
        for f in files:
            mark = "" if f["status"] == "ok" else f"  [{f['status']}: {shown(f['reason'])}]"
            print(f"{f['mime_type'] or '-':<24} {f['modality'] or '-':<9} {f['size']:>10}  {shown(f['path'])}{mark}")
    elif problems:
        for f in problems:
            print(f"{f['status']}: {shown(f['path'])}: {shown(f['reason'])}")
    print(f"Found {n_text} text files, {n_media} media files")
    if problems:
        reasons = Counter(f["status"] for f in problems)
        print(f"Not indexed: {len(problems)} ({', '.join(f'{n} {s}' for s, n in sorted(reasons.items()))}); see reasons above")
    return 0


# --- status ------------------------------------------------------------------------------


def cmd_status(args) -> int:
    from memory_pipeline import storage
    from memory_pipeline.batching.report import batch_status
    from memory_pipeline.providers.registry import resolve_provider
    from memory_pipeline.runner import last_run
    from memory_pipeline.stages.report import indexed_by_source, records_match_table
    from memory_pipeline.stores.cache import entries as cache_size
    from memory_pipeline.stores.lance import VectorStore

    settings = _settings(args)
    try:
        resolved = resolve_provider(settings)
        provider = resolved.provider
        prov = {
            "requested": settings.provider,
            "provider": provider.name if provider else "none",
            "model": provider.model if provider else None,
            "dims": provider.dims if provider else 0,
            "reason": resolved.reason,
            "fallback": settings.fallback,
            "fallback_from": resolved.fallback_from,
        }
    except MemoryPipelineError as err:
        prov = {"requested": settings.provider, "provider": None, "error": str(err)}
    from memory_pipeline.stores import generations

    table_name, _ = generations.current(settings)
    store = VectorStore(storage.of(settings).lancedb_uri, table_name)
    per_source, recorded_chunks, fingerprints = indexed_by_source(settings)
    cache_entries, cache_error = 0, ""
    if storage.of(settings).cache_path.is_file():
        try:  # read only: status also reports a data folder this user cannot write
            cache_entries = cache_size(storage.of(settings).cache_path)
        except sqlite3.Error as err:  # the rest of the status still helps; `memory doctor` says what to do
            cache_error = f"cannot read the cache: {err}"
    table = store.open()
    data = storage.of(settings)
    rows = table.count_rows() if table is not None else 0
    described = generations.describe(settings)
    # The records against the table (cheap: two counts): rows deleted outside a run, or a table
    # restored from elsewhere. After a rollback or while a generation builds: no claim.
    mismatch = records_match_table(settings, rows, recorded_chunks, fingerprints)
    if mismatch:
        mismatch += ": run `memory index` (it repairs the table)"
    status = {
        "config": str(settings.config_path),
        "data_dir": data.location,
        **({"local_dir": str(data.root)} if data.remote else {}),
        **prov,
        "table": {
            "uri": storage.of(settings).lancedb_uri,
            "name": table_name,
            "exists": table is not None,
            "rows": rows,
            "recorded_chunks": recorded_chunks,
            "dims": store.dims(),
            "built_with": store.meta(),
            **({"mismatch": mismatch} if mismatch else {}),
        },
        "generations": described,
        "sources": per_source,
        "cache": {
            "enabled": settings.cache.enabled,
            "entries": cache_entries,
            "max_entries": settings.cache.max_entries,
            "path": str(storage.of(settings).cache_path),
            **({"error": cache_error} if cache_error else {}),
        },
        "last_run": last_run(settings),
        "batch": batch_status(settings),
    }
    if status["last_run"]:
        status["last_run"] = {k: v for k, v in status["last_run"].items() if k != "errors"} | {"errors": len(status["last_run"].get("errors", []))}
    if args.json:
        _print_json(status)
        return 0
    print(f"config:   {status['config']}")
    print(f"data:     {status['data_dir']}" + (f" (this machine's part: {status['local_dir']})" if data.remote else ""))
    if prov.get("provider") not in (None, "none"):
        print(f"provider: {prov['provider']} / {prov.get('model')} ({prov.get('dims')} dims); requested {prov['requested']}")
    elif prov.get("requested") == "none":
        print("provider: none — full-text search only (as configured)")
    else:
        print(f"provider: none ({prov.get('reason') or prov.get('error')}) — full-text search only")
    if prov.get("fallback_from"):
        print(f"fallback: {prov['reason']}")
    t = status["table"]
    print(f"table:    {t['uri']}/{t['name']}  rows={t['rows']} dims={t['dims']}" + ("" if t["exists"] else "  (not built yet: run `memory index`)"))
    for g in status["generations"]["generations"]:
        if g["role"] != "current":
            print(f"  {g['role']:<9} {g['table']}: {g['provider']}/{g['model']} ({g['dims']} dims), {g['rows']} rows")
    if mismatch:
        print(f"[WARN] {mismatch}")
    for name, s in per_source.items():
        stale = f" ({s['stale_files']} by an older version: the file fails now)" if s["stale_files"] else ""
        print(f"source:   {name}: {s['files']} files seen, {s['indexed_files']} indexed{stale}, {s['chunks']} chunks")
    c = status["cache"]
    print(f"cache:    {c['entries']} / {c['max_entries']} entries ({'on' if c['enabled'] else 'off'})" + (f"; {c['error']}" if cache_error else ""))
    lr = status["last_run"]
    print(f"last run: {lr['finished_at']} ({lr['files_changed']} changed, {lr['errors']} errors)" if lr else "last run: never")
    _print_batch_status(status["batch"])
    return 0


# --- generations -------------------------------------------------------------------------


def cmd_generations(args) -> int:
    from memory_pipeline.stores import generations

    settings = _settings(args)
    if args.action == "rollback":
        generations.rollback(settings)
    elif args.action == "prune":
        dropped = generations.prune(settings)
        if not args.json:
            print(f"dropped {len(dropped)} previous generation(s): {', '.join(dropped) or '-'}")
    info = generations.describe(settings)
    if args.json:
        _print_json(info)
        return 0
    if not info["generations"]:
        print("no table yet: run `memory index`")
    for g in info["generations"]:
        print(f"{g['role']:<9} {g['table']}: {g['provider']}/{g['model']} ({g['dims']} dims), {g['rows']} rows, created {g['created_at']}")
    return 0


def _print_batch_status(b: dict) -> None:
    state = "on" if b["enabled"] else "off"
    print(f"batch:    {state} (wait: {'yes' if b['wait'] else 'no'}), {len(b['pending_jobs'])} pending jobs")
    for j in b["pending_jobs"]:
        print(
            f"          {j['provider']} {j['job_id'] or '(submitting)'}: {j['remote_status'] or j['state']}, "
            f"{j['requests']} requests, {j['age_s']}s old" + (" (finished: the next run collects it)" if j["ready"] else "")
        )
    for name, p in b["providers"].items():
        if p["disabled"]:
            print(f"          {name}: batching DISABLED ({p['reason']}); `memory doctor --reset-batch` re-enables it")
        elif p["failures"]:
            print(f"          {name}: {p['failures']} recent batch failure(s)")


# --- doctor ------------------------------------------------------------------------------


def cmd_doctor(args) -> int:
    from memory_pipeline.doctor import run_doctor

    if getattr(args, "reset_batch", False):
        from memory_pipeline.batching.report import reset_batch

        names = reset_batch(_settings(args))
        print(f"batching re-enabled for: {', '.join(names)}" if names else "batching was not disabled for any provider", file=sys.stderr)

    report = run_doctor(args.config)
    if args.json:
        _print_json(report)
    else:
        for c in report["checks"]:
            fix = f"\n          fix: {c['fix']}" if c.get("fix") else ""
            print(f"[{c['status']:<4}] {c['name']}: {c['detail']}{fix}")
        warned = sum(c["status"] == "warn" for c in report["checks"])
        if not report["ok"]:
            print("problems found: see the fixes above")
        else:
            print(f"no problems; {warned} warning{'s' if warned != 1 else ''} above" if warned else "all good")
    return 0 if report["ok"] else 1


# --- config ------------------------------------------------------------------------------


def cmd_config(args) -> int:
    from memory_pipeline import config_cmd

    try:
        return config_cmd.run(args)
    except config_cmd.SettingRefused as err:  # a key or value that cannot be set: a usage error
        raise UsageError(shown(err)) from err


# --- analytics ---------------------------------------------------------------------------


@contextlib.contextmanager
def _duckdb_errors(what: str, hint: str) -> Iterator[None]:
    """A DuckDB error (its own types, for bad SQL or a file it cannot read) as one line: ``what``,
    the error's first line, and ``hint``; any other error goes on as it is."""
    try:
        yield
    except Exception as err:
        if "duckdb" not in type(err).__module__:
            raise
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise MemoryPipelineError(f"{what}: {first}", hint=hint) from err


def cmd_analytics(args) -> int:
    from memory_pipeline.stores.analytics import query, up_to_date

    settings = _settings(args)
    # Building the database reads files DuckDB may fail on (damaged, unreadable).
    with _duckdb_errors("cannot build the analytics database", "`memory index` repairs or reports the data folder's files; `memory status` shows them"):
        up_to_date(settings)
    with _duckdb_errors("query failed", "check the SQL; tables: coverage, problems, file_status, embedding_cost, prices, source_files, vector_rows, runs"):
        if args.sql:
            rows = query(settings, args.sql).to_pylist()
            if args.json:
                _print_json({"rows": rows})
            else:
                _print_rows(rows)
            return 0
        coverage = query(settings, "SELECT * FROM coverage").to_pylist()
        problems = query(settings, "SELECT kind, count(*) AS files, sum(rows)::BIGINT AS rows FROM problems GROUP BY kind ORDER BY kind").to_pylist()
        # The problems themselves: `detail` holds the reason (a failed or skipped file's, or what is wrong with its rows).
        problem_files = query(settings, PROBLEM_FILES_SQL).to_pylist()
        cost = query(settings, "SELECT * FROM embedding_cost ORDER BY provider, model").to_pylist()
    if args.json:
        _print_json({"coverage": coverage, "problems": problems, "problem_files": problem_files, "embedding_cost": cost})
        return 0
    _print_rows(coverage)
    print()
    if problem_files:
        shown_rows = [{k: shown("" if r[k] is None else r[k]) for k in ("kind", "path", "reason")} for r in problem_files[:PROBLEMS_SHOWN]]
        _print_rows(shown_rows, width=100)
        if len(problem_files) > PROBLEMS_SHOWN:
            print(f'… {len(problem_files) - PROBLEMS_SHOWN} more (memory analytics --json lists them all, or --sql "SELECT * FROM problems")')
        print()
    _print_rows(problems) if problems else print("no problems")
    if cost:
        print()
        _print_rows(cost)
    return 0


PROBLEMS_SHOWN = 20
PROBLEM_FILES_SQL = "SELECT kind, path, detail AS reason, doc_id, rows FROM problems ORDER BY kind, path, doc_id"


def _print_rows(rows: list[dict], width: int = 60) -> None:
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])
    cells = [[("" if r[c] is None else (f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))) for c in cols] for r in rows]
    widths = [min(max(len(c), *(len(row[i]) for row in cells)), width) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    for row in cells:
        print("  ".join(v[:width].ljust(w) for v, w in zip(row, widths)).rstrip())


# --- entry point -------------------------------------------------------------------------


def _in_range(kind: type, low: float, high: float):
    """An argparse type: a number of ``kind`` from ``low`` to ``high`` (the bounds of the config and
    of the HTTP API's search options; NaN is in no range)."""

    def parse(value: str):
        try:
            number = kind(value)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"not {'a whole number' if kind is int else 'a number'}: {value!r}") from err
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {value!r}")
        return number

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _iso_date(value: str):
    import datetime as dt

    try:
        return dt.date.fromisoformat(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {value!r}") from err


def _sub(sub, name: str, parents, help: str, example: str, more: str = ""):
    """A subcommand whose --help ends with one example command line."""
    return sub.add_parser(
        name, parents=parents, help=help, description=help[:1].upper() + help[1:] + "." + (f"\n\n{more}" if more else ""),
        epilog=f"Example:\n  {example}", formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip


JSON_HELP = "print one JSON object on stdout instead of text (for scripts and agents), e.g. --json"


def build_parser() -> argparse.ArgumentParser:
    from memory_pipeline import __version__

    parser = argparse.ArgumentParser(
        prog="memory", description="Index and search an agent's memory folder.",
        epilog="Example:\n  memory index && memory search \"what did we decide about the standup\"",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"memory_pipeline {__version__}", help="print the version and exit, e.g. memory --version")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        metavar="FILE",
        help="the config file (default: $MEMORY_PIPELINE_CONFIG, then ./memory_pipeline.yaml), e.g. --config ~/agent/memory_pipeline.yaml",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = _sub(sub, "index", [common], "index the configured sources (the whole Dagster graph, in-process)", "memory index --json")
    p.add_argument("--force", action="store_true", help="re-index every file (vectors still come from the cache), e.g. memory index --force")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress or summary (errors still go to stderr), e.g. --quiet")
    p.set_defaults(func=cmd_index)

    p = _sub(sub, "search", [common], "hybrid search of the index", 'memory search "standup time" --since 2026-11-01 --max-results 5')
    p.add_argument("query", nargs="?", default="", help='what to look for, in words, e.g. "when is the standup"')
    p.add_argument("--image", metavar="FILE", help="query by an image: its OCR text, photo details and note, e.g. --image whiteboard.jpg")
    p.add_argument("--audio", metavar="FILE", help="query by a recording: its transcript, e.g. --audio memo.m4a")
    p.add_argument(
        "--type",
        action="append",
        type=_result_types,
        metavar="TYPE[,TYPE]",
        help="only results of these types: image, audio, video, pdf, document (includes pdf), text; repeatable or comma-separated, e.g. --type image,audio",
    )
    p.add_argument(
        "--max-results",
        type=_in_range(int, 1, 200),
        default=None,
        metavar="N",
        help="return at most N results (default: query.max_results), e.g. --max-results 5",
    )
    p.add_argument(
        "--min-score",
        type=_in_range(float, 0, 1),
        default=None,
        metavar="SCORE",
        help="drop results scoring below SCORE (default: query.min_score), e.g. --min-score 0.3",
    )
    p.add_argument(
        "--mode",
        choices=["hybrid", "vector", "fts"],
        default="hybrid",
        help="hybrid (vectors + full text, the default), vector only, or fts (full text only), e.g. --mode fts",
    )
    p.add_argument("--fusion", choices=["weighted", "rrf"], default=None, help="how hybrid fuses the legs (default: query.fusion), e.g. --fusion rrf")
    p.add_argument("--source", help="only this source (a name from the config's sources), e.g. --source memory")
    p.add_argument("--path", metavar="GLOB", help="only paths matching this glob (relative to the source), e.g. --path 'memory/2026-*.md'")
    p.add_argument("--modality", action="append", help="only this modality (markdown, text, session, ...); repeatable, e.g. --modality markdown")
    p.add_argument("--since", type=_iso_date, metavar="DATE", help="only notes dated on or after DATE (file-name date, else mtime), e.g. --since 2026-11-01")
    p.add_argument("--until", type=_iso_date, metavar="DATE", help="only notes dated on or before DATE, e.g. --until 2026-11-30")
    p.add_argument("--mmr", action=argparse.BooleanOptionalAction, default=None, help="diversify results (default: query.mmr), e.g. --mmr or --no-mmr")
    p.add_argument(
        "--mmr-lambda",
        type=_in_range(float, 0, 1),
        default=None,
        metavar="X",
        help="MMR trade-off: 1 = relevance only, 0 = diversity only, e.g. --mmr-lambda 0.7",
    )
    p.add_argument(
        "--recency-half-life",
        type=_in_range(float, 0, 36500),
        default=None,
        metavar="DAYS",
        help="dated notes lose half their score every DAYS (0 = off), e.g. --recency-half-life 30",
    )
    p.add_argument(
        "--retrieval-mode",
        choices=["auto", "text", "native", "hybrid"],
        default="auto",
        help="query files by their derived text (text), their native vector (native), both (hybrid), "
        "or text plus native when the index has native vectors (auto, the default), e.g. --retrieval-mode text",
    )
    p.add_argument("--no-server", action="store_true", help="search in this process even when `memory serve` runs for this data folder, e.g. --no-server")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_search)

    p = _sub(
        sub,
        "store",
        [common],
        "put a file (photo, recording, PDF, note) into memory with a note, and index it",
        'memory store --file receipt.jpg --note "hotel receipt, Lisbon trip"',
    )
    p.add_argument("--file", required=True, metavar="FILE", help="the file to store, e.g. --file receipt.jpg")
    p.add_argument("--note", help='what the file is about; stored beside it as FILE.note.md and searched with it, e.g. --note "hotel receipt"')
    p.add_argument("--source", help="the source folder to copy into (default: the first), e.g. --source memory")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_store)

    p = _sub(
        sub,
        "serve",
        [common],
        "serve the memory to agents: HTTP API, AgentOS multimodal routes, MCP at /mcp",
        "memory serve --port 8765",
        "Anything but a loopback --host needs a bearer token in $MEMORY_PIPELINE_TOKEN.",
    )
    p.add_argument("--host", help="address to listen on (default: service.host, 127.0.0.1), e.g. --host 127.0.0.1")
    p.add_argument("--port", type=_in_range(int, 0, 65535), help="port (default: service.port, 8765; 0 = any free port), e.g. --port 8765")
    p.add_argument(
        "--assets-source",
        metavar="NAME",
        help="the source ingested assets are written to (default: service.assets_source, else the first), e.g. --assets-source memory",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="allow browser calls from ORIGIN (default: service.cors_origins; CORS is off when none), e.g. --cors-origin http://localhost:3000",
    )
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"], help="server log level, e.g. --log-level info")
    p.set_defaults(func=cmd_serve)

    p = _sub(
        sub,
        "mcp",
        [common],
        "the MCP server (memory_search, memory_get, memory_store, memory_status) over stdio",
        "memory mcp --config ~/agent/memory_pipeline.yaml",
    )
    p.set_defaults(func=cmd_mcp)

    p = _sub(
        sub,
        "eval",
        [common],
        "retrieval quality on a BEIR-format corpus (nDCG@10, recall, MRR, latency, abstention)",
        "memory eval --corpus corpus.jsonl --queries queries.jsonl --qrels qrels/test.tsv --mode hybrid,fts",
        "Abstention, per mode of this project: the share of judged queries for which the search as configured\n"
        "(min_score, standout rule) returns nothing, and of queries without qrels (no-answer) that it answers.",
    )
    p.add_argument("--corpus", required=True, metavar="FILE", help="corpus.jsonl: {_id, title, text} per line, e.g. --corpus scifact/corpus.jsonl")
    p.add_argument(
        "--queries",
        required=True,
        metavar="FILE",
        help="queries.jsonl: {_id, text} per line; queries without qrels count as no-answer queries, e.g. --queries scifact/queries.jsonl",
    )
    p.add_argument("--qrels", required=True, metavar="FILE", help="qrels TSV with a header: query-id, corpus-id, score, e.g. --qrels scifact/qrels/test.tsv")
    p.add_argument(
        "--mode",
        action="append",
        default=None,
        help="hybrid, vector, fts, lancedb-rrf; comma-separated or repeated (default: hybrid,vector,fts), e.g. --mode hybrid,fts",
    )
    p.add_argument("--keep", metavar="DIR", help="build the temporary index in DIR and keep it, e.g. --keep /tmp/eval-index")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_eval)

    p = _sub(sub, "scan", [common], "what would be indexed, and why anything is skipped", "memory scan --verbose")
    p.add_argument("--verbose", action="store_true", help="list every file with its type and size, e.g. --verbose")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_scan)

    p = _sub(
        sub,
        "analytics",
        [common],
        "index coverage (DuckDB), or any SQL over the analytics database",
        "memory analytics --sql \"SELECT kind, path, detail FROM problems WHERE kind = 'failed'\"",
        "Without --sql: the coverage table, then the files that are not fully indexed with their reasons\n"
        "(up to 20; --json lists them all). Tables: coverage, problems, file_status, vector_rows, runs, ...",
    )
    p.add_argument("--sql", help="run this query and print its rows, e.g. --sql \"SELECT * FROM problems WHERE kind = 'failed'\"")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_analytics)

    p = _sub(sub, "generations", [common], "table generations (one per embedding model); rollback, prune", "memory generations rollback")
    p.add_argument(
        "action",
        nargs="?",
        choices=["list", "rollback", "prune"],
        default="list",
        help="list them (the default), rollback to the previous one, or prune the previous ones, e.g. rollback",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_generations)

    p = _sub(sub, "doctor", [common], "check the config, each provider (one test embedding), the table and the cache", "memory doctor --json")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--reset-batch", action="store_true", help="re-enable provider batch APIs disabled after failures, e.g. memory doctor --reset-batch")
    p.set_defaults(func=cmd_doctor)

    p = _sub(sub, "status", [common], "provider, table, sources, cache and last run", "memory status --json")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_status)

    p = _sub(
        sub,
        "config",
        [],
        "show the effective configuration, or change one setting in the file",
        "memory config set chunking.tokens 256",
        "memory config show [KEY] [--json]: every setting, defaults included (paths written with $VARS as written)\n"
        "memory config set KEY VALUE: validated with the whole file before it is written (comments kept)",
    )
    config_sub = p.add_subparsers(dest="action", required=True)
    c = _sub(config_sub, "show", [common], "print every setting, defaults included, as YAML (or JSON)", "memory config show query --json")
    c.add_argument("key", nargs="?", help="only this setting or section, e.g. query.min_score or sources[0]")
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c = _sub(
        config_sub,
        "set",
        [common],
        "set one setting in the config file (created if missing), validated first",
        'memory config set multimodal.types "[image, pdf]"',
    )
    c.add_argument("key", help="the setting, dotted, e.g. chunking.tokens or sources[0].path")
    c.add_argument("value", help='its value as YAML: a number, true/false, text, null or a list, e.g. 256 or "[image, pdf]"')
    p.set_defaults(func=cmd_config)
    return parser


def _warnings_to_stderr() -> None:
    """Our own warnings (e.g. a search that fell back to full text) as one `[WARN]` line each."""
    import logging

    logger = logging.getLogger("memory_pipeline")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[WARN] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
        logger.propagate = False


def _fewer_malloc_arenas() -> None:
    """Two malloc arenas, as ``MALLOC_ARENA_MAX=2`` would give (a value in the environment wins).

    glibc gives threads that allocate arenas of their own (up to eight per core), and each keeps
    what was freed in it; with Lance's and the model's thread pools that held about 40 MB more
    at the peak of a 100k-chunk `memory index` (995 MB without this call, 956 MB with it)."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc


def main(argv: list[str] | None = None, *, hooks=None) -> int:
    """The `memory` command. ``hooks`` (``stages.StageHooks``): points a caller can act at
    during `memory index` (tests inject them; see memory_pipeline_tests/fault_cli.py)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")
    _fewer_malloc_arenas()
    args = build_parser().parse_args(argv)
    args.hooks = hooks
    _warnings_to_stderr()
    if getattr(args, "command", None) == "eval" and args.mode is None:
        args.mode = ["hybrid,vector,fts"]
    global _JSON_PRINTED
    _JSON_PRINTED = False
    real_stdout = sys.stdout
    try:
        if real_stdout is not None and not isinstance(real_stdout, _GuardedOutput):
            sys.stdout = _GuardedOutput(real_stdout)
        return args.func(args)
    except UsageError as err:
        print(f"memory {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OutputFailed as err:
        _drop_output()
        print(f"[ERROR] could not write the output: {err}", file=sys.stderr)
        return 120
    except MemoryPipelineError as err:
        _json_failure(args, str(err), err.hint or "")
        hint = f" ({err.hint})" if err.hint else ""
        print(f"[ERROR] {shown(err)}{shown(hint)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _json_failure(args, INTERRUPTED, interrupted=True)
        print(f"[ERROR] {INTERRUPTED}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (`| head`) went away: not an error of ours; keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:
        # The disk, the file system or the object store, not this program (a broken pipe is handled above, and
        # the object store's errors that are told apart are StoreErrors): what failed, on one line.
        from memory_pipeline.storage import one_line

        _json_failure(args, one_line(f"{type(err).__name__}: {err}", 500), "a file or storage error: check the data folder's disk and permissions")
        print(
            f"[ERROR] {shown(one_line(f'{type(err).__name__}: {err}', 500))} (a file or storage error: check the data folder's disk and permissions, or the object store's address and credentials)",
            file=sys.stderr,
        )
        return 1
    except Exception as err:  # noqa: BLE001 - a bug of ours: one line, never a traceback
        from memory_pipeline.stores.cache import disk_failure

        disk = disk_failure(err)
        if disk is not None:  # a SQLite file of the data folder (Dagster's instance, the cache): not a bug
            _json_failure(args, _disk_failed(getattr(args, "loaded_settings", None), disk))
            print(f"[ERROR] {shown(_disk_failed(getattr(args, 'loaded_settings', None), disk))}", file=sys.stderr)
            return 1
        _json_failure(args, f"unexpected error: {type(err).__name__}: {err}", "a bug in memory_pipeline: please report it with the command you ran")
        print(
            f"[ERROR] unexpected error: {type(err).__name__}: {shown(err)} (a bug in memory_pipeline: please report it with the command you ran)",
            file=sys.stderr,
        )
        return 1
    finally:
        sys.stdout = real_stdout


def _json_failure(args, message: str, hint: str = "", *, interrupted: bool = False) -> None:
    """A `--json` command that fails before printing its object prints this one instead: scripts and
    agents parse stdout, and an empty one tells them nothing (the `[ERROR]` line still goes to
    stderr, and the exit status is the same). Never a second object, and never when stdout is what
    failed. A usage error (exit 2: a bad option, found before the command runs) prints nothing there."""
    if not getattr(args, "json", False) or _JSON_PRINTED:
        return
    obj: dict = {"ok": False, "error": message, "hint": hint}
    if interrupted:
        obj["interrupted"] = True
    with contextlib.suppress(OutputFailed, BrokenPipeError, ValueError):
        _print_json(obj)


def _disk_failed(settings, err: BaseException) -> str:
    """One line for a disk that is full or failing under the data folder (its local part)."""
    from memory_pipeline import storage

    folder = f"the data folder {storage.of(settings).root}" if settings is not None else "the data folder"
    return f"the disk of {folder} is full or failing ({err}): free space on it or check the disk, then run the same command again"


def run() -> NoReturn:
    """The `memory` command as a process: :func:`main`, then :func:`exit_process`."""
    exit_process(main())


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: the interpreter's exit done by hand, in its order (non-daemon
    threads joined, ``atexit`` handlers run: logging flushed, worker processes stopped, temporary
    folders removed; the standard streams flushed), without its last step, tearing every module
    down. That step changes nothing on disk or in the output (every commit, connection and file is
    closed before main returns) and took about a second after an index run with the model loaded
    (1,000 notes, torch runtime: 0.95 s of 48.2 s wall). Output that cannot be written at that
    point makes the status 120, as the interpreter's own exit does."""
    import atexit
    import threading

    try:
        threading._shutdown()  # pyright: ignore[reportAttributeAccessIssue] - joins non-daemon threads, as at exit
        atexit._run_exitfuncs()
    except KeyboardInterrupt:  # Ctrl-C while the exit waits: stop waiting, still no traceback
        code = code or 130
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the process was started with that descriptor closed
                stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away (`| head`), or the stream is closed
            pass
        except OSError as err:  # the output could not be written (disk full, I/O error): not a success
            code = code or 120
            with contextlib.suppress(Exception):
                os.write(2, f"[ERROR] could not write the output: {err}\n".encode())
    os._exit(code)


if __name__ == "__main__":
    run()
