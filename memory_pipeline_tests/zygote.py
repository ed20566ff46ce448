"""A fork server for the tests' `memory` processes: each CLI call is a fresh process, without
paying the third-party imports again.

Most of the suite's time went into `python -m memory_pipeline.cli` start-ups: torch,
transformers, sentence-transformers and Dagster take seconds to import, and the suite starts
a few hundred such processes. This server imports those packages once (single-threaded:
nothing here starts a thread, so forking is safe) and forks a child per request. The child is
then set up as ``subprocess.run`` would set up a new process — the request's environment,
working directory, stdin/stdout/stderr (passed as file descriptors), argv — and runs the module
with ``runpy`` as ``python -m`` does; it leaves through the interpreter's normal exit (atexit
handlers, non-daemon threads joined, an uncaught exception printed with exit status 1), so
exit codes and output are the real ones. ``memory_pipeline`` itself is never imported here:
each child imports the code under test afresh.

What a child shares with the server and a new interpreter would not: the packages imported
below, with whatever they read from the environment at import time. ``helpers.run_cli``
therefore starts a real new interpreter when a request changes such variables (``PYTHON*``,
``HF_*``, ``TRANSFORMERS_*``, ``TORCH*``, ``OMP_*``, ``MKL_*``, ``TOKENIZERS_*``, and those the
preloaded SDKs read: ``OPENAI_LOG``, ``OPENAI_API_*``, ``FSSPEC_*``, ``NO_COLOR``, ``SSL_CERT_*``, …) or when a
test asks for ``fresh=True`` (a test about start-up itself). ``PYTHONPATH`` is the exception:
the child puts it on ``sys.path`` itself, and execs a new interpreter when it would shadow a
module imported here (``_set_python_path``).

Protocol (one Unix stream connection per call): the client sends one JSON line
``{"module", "argv", "env", "cwd"}`` together with three descriptors
(stdin, stdout, stderr) via SCM_RIGHTS; the server answers ``<pid>\\n`` when the child is
started and ``<returncode>\\n`` (negative: killed by that signal) when it has ended.

    python -m memory_pipeline_tests.zygote SOCKET_PATH
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import socket
import sys

# Imported once here, shared (copy-on-write) by every child. Importing these starts no thread
# but lancedb's event loop, which lancedb itself restarts in a forked child (its at-fork hook);
# the warning it gives about that is silenced in the children.
PRELOAD = (
    "numpy",
    "pyarrow",
    "pyarrow.parquet",
    "torch",
    "transformers",
    "sentence_transformers",
    "onnxruntime",
    "tokenizers",
    "dagster",
    "lancedb",
    "polars",
    "duckdb",
    "yaml",
    "pydantic",
    # What an index or search run imports lazily on top of those (found by listing the modules a
    # child had imported after `memory index`, `search`, `status`, `doctor`, `analytics` and a run
    # with a remote provider): Dagster's instance, storage and execution modules, SQLAlchemy and
    # Alembic (the instance's schema), the providers' SDKs, the secret scanner, fsspec/upath. About
    # 1.3 s of imports per `memory` call otherwise.
    "dagster._core.execution.execute_in_process",
    "dagster._core.instance.factory",
    "dagster._core.instance.runs.run_domain",
    "dagster._core.secrets.loader",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.event_log.sqlite.consolidated_sqlite_event_log",
    "dagster._core.storage.legacy_storage",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "dagster._core.storage.noop_compute_log_manager",
    "dagster._core.storage.migration.utils",
    "dagster._core.workspace.context",
    "dagster._core.execution.asset_backfill",
    "dagster._daemon.controller",
    "alembic.command",
    "alembic.runtime.migration",
    "openai",
    "openai.resources.embeddings",
    "google.genai",
    "httpx",
    "requests",
    "detect_secrets.core.scan",
    "detect_secrets.plugins.aws",
    "detect_secrets.plugins.cloudant",
    "detect_secrets.plugins.ibm_cloud_iam",
    "detect_secrets.plugins.ibm_cos_hmac",
    "detect_secrets.plugins.softlayer",
    "dotenv",
    "fsspec.implementations.local",
    "upath.implementations.local",
    "tiktoken",
    "tiktoken_ext.openai_public",
    "rich",
)
# Environment variables that these packages (or the interpreter) read at start-up: a request
# that changes one of them needs a new interpreter.
IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "HF_",
    "TRANSFORMERS_",
    "TORCH",
    "OMP_",
    "MKL_",
    "TOKENIZERS_",
    "SENTENCE_TRANSFORMERS",
    "OPENAI_LOG",
    # openai/__init__.py reads these three at import; OPENAI_API_KEY and the rest only in the client.
    "OPENAI_API_TYPE",
    "OPENAI_API_VERSION",
    "AZURE_OPENAI_ENDPOINT",
    "FSSPEC_",
    "NO_COLOR",
    "FORCE_COLOR",
    "WEBSOCKETS_",
    "SSL_CERT_",
    "LANCEDB_LOG",  # lancedb's native logger reads it when lancedb is imported
)


def _preload() -> None:
    import importlib
    import logging
    import warnings

    shown = warnings.showwarning
    # As importing memory_pipeline does in a `memory` process, before lancedb (its native logger
    # reads this once, at import); a request that sets it gets a new interpreter (IMPORT_TIME_PREFIXES).
    os.environ.setdefault("LANCEDB_LOG", "error")
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # pragma: no cover - an optional package missing only costs time
            pass
    if warnings.showwarning is not shown:
        # detect-secrets turns on logging.captureWarnings at import; a new `memory` process has not
        # imported it (it is loaded on first need), so its children would hide every warning.
        logging.captureWarnings(False)


def _drop_file_read_override() -> None:  # pragma: no cover - runs in the child
    """Drop root's CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH so file permissions apply to it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop = 24
    for cap in (1, 2):
        if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def _serve(path: str) -> tuple[dict, list[int]]:
    """Accept requests forever; returns only in a forked child, with its request and descriptors."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}  # child pid -> the client to tell its exit status
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for _ready in sel.select(timeout=0.02):
            conn, _ = listener.accept()
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                while not data.endswith(b"\n"):
                    more = conn.recv(1 << 20)
                    if not more:
                        break
                    data += more
                request = json.loads(data)
            except (OSError, ValueError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


def _become(request: dict, fds: list[int]) -> None:
    """Set this forked child up as a new process for the request."""
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    server_path = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # `python -m` puts the working directory first on the path.
    sys.path[0] = os.getcwd()
    sys.argv = [request["module"], *request["argv"]]
    if os.environ.get("PYTHONPATH", "") != server_path:
        _set_python_path(server_path, os.environ.get("PYTHONPATH", ""))


def _entries(value: str) -> list[str]:
    return [os.path.abspath(p) for p in value.split(os.pathsep) if p]


def _set_python_path(server_value: str, value: str) -> None:
    """The request's PYTHONPATH on ``sys.path`` where a new interpreter puts it (after the working
    directory, before the standard library), the server's own entries taken out.

    A module imported here already cannot be shadowed by it: when one of its folders holds a
    top-level module or package of that name, from elsewhere, this child execs a new
    interpreter instead (same process, descriptors and environment), as ``helpers.run_cli``
    would have started one.
    """
    old, new = set(_entries(server_value)), _entries(value)
    for folder in new:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            top = name.split(".", 1)[0]
            module = sys.modules.get(top)
            if module is None or not top.isidentifier():
                continue
            origin = getattr(module, "__file__", None) or ""
            if not os.path.abspath(origin).startswith(folder + os.sep):
                os.execv(sys.executable, [sys.executable, "-m", *sys.argv])
    sys.path[1:] = [*new, *(p for p in sys.path[1:] if p not in old and p not in new)]


def main() -> None:
    path = sys.argv[1]
    _preload()
    import warnings

    warnings.filterwarnings("ignore", message="lancedb fork support")  # given in each child, at fork
    # The preloaded objects are never collected: the children's collections skip them (and so
    # do not copy every page of the server's heap).
    gc.freeze()
    request, fds = _serve(path)
    _become(request, fds)
    code = _run(request["module"])
    from memory_pipeline.cli import exit_process  # after the run: runpy warns about a module imported before it runs

    exit_process(code)


def _run(module: str) -> int:
    """Run the module as `python -m` would; the exit status the interpreter would give. The exit
    itself is the `memory` command's own (``cli.exit_process``: everything but tearing the modules
    down, seconds over the preloaded packages, which changes nothing a test can see)."""
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as stop:
        return _exit_code(stop.code)
    except BaseException as err:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(type(err), err, err.__traceback__)
        return 1


def _exit_code(code) -> int:
    """``SystemExit.code`` as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
