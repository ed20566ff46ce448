"""Import side effects: memory_pipeline.lazy_imports (a package registered with its __init__
deferred loads its submodules without it and runs it, once, on the first other look-up), and the
secret scanner's import leaving Python's warnings as they were."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memory_pipeline.lazy_imports import defer_package_init


def _runs() -> int:
    """How many times the test package's __init__ has run."""
    import builtins

    return getattr(builtins, "SLOWPKG_RUNS", 0)


@pytest.fixture
def package(tmp_path: Path, monkeypatch):
    """A package ``slowpkg_t`` whose __init__ counts its runs and imports its ``api`` submodule."""
    root = tmp_path / "slowpkg_t"
    (root / "models").mkdir(parents=True)
    (root / "__init__.py").write_text(
        "import builtins\nbuiltins.SLOWPKG_RUNS = getattr(builtins, 'SLOWPKG_RUNS', 0) + 1\nfrom slowpkg_t.api import Client\nVERSION = '1.2'\n"
    )
    (root / "api.py").write_text("class Client:\n    pass\n")
    (root / "models" / "__init__.py").write_text("from slowpkg_t.models.thing import Thing\n")
    (root / "models" / "thing.py").write_text("class Thing:\n    kind = 'thing'\n")
    (tmp_path / "plainmod_t.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "SLOWPKG_RUNS", 0, raising=False)
    yield "slowpkg_t"
    for name in [m for m in sys.modules if m.split(".")[0] in ("slowpkg_t", "plainmod_t")]:
        del sys.modules[name]


def test_submodules_load_without_the_init_and_the_init_runs_once_on_first_use(package):

    assert defer_package_init(package)
    from slowpkg_t.models.thing import Thing  # pyright: ignore[reportMissingImports]

    assert Thing.kind == "thing"
    assert _runs() == 0 and "slowpkg_t.api" not in sys.modules
    pkg = sys.modules[package]
    assert pkg.VERSION == "1.2"  # the first other look-up runs __init__
    assert _runs() == 1 and "slowpkg_t.api" in sys.modules
    from slowpkg_t import Client  # pyright: ignore[reportMissingImports]

    assert Client.__name__ == "Client" and pkg.models.Thing is Thing
    assert type(pkg) is type(sys)  # an ordinary module from then on
    assert _runs() == 1


def test_from_import_of_a_name_runs_the_init(package):

    assert defer_package_init(package)
    from slowpkg_t import Client  # pyright: ignore[reportMissingImports]

    assert Client.__name__ == "Client" and _runs() == 1


def test_a_missing_name_is_still_an_attribute_error_after_the_init(package):
    assert defer_package_init(package)
    with pytest.raises(AttributeError):
        sys.modules[package].no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        from slowpkg_t import no_such_name  # noqa: F401  # pyright: ignore[reportMissingImports, reportAttributeAccessIssue]


def test_tooling_probes_do_not_run_the_init(package):

    assert defer_package_init(package)
    assert not hasattr(sys.modules[package], "__wrapped__")
    assert _runs() == 0


def test_nothing_changes_for_imported_missing_or_plain_modules(package):
    import importlib

    importlib.import_module(package)
    assert not defer_package_init(package)  # already imported
    assert not defer_package_init("no_such_package_t")
    assert not defer_package_init("plainmod_t")  # a module, not a package
    assert "plainmod_t" not in sys.modules


def test_lancedb_in_a_new_process_skips_the_rest_client_and_still_works(tmp_path: Path):
    code = textwrap.dedent(
        """
        import sys
        import memory_pipeline, lancedb
        skipped = "lance_namespace_urllib3_client.api" not in sys.modules
        db = lancedb.connect(sys.argv[1])
        table = db.create_table("t", data=[{"id": 1, "vector": [0.1, 0.2]}, {"id": 2, "vector": [0.9, 0.8]}])
        hit = table.search([0.1, 0.2]).limit(1).to_list()[0]["id"]
        from lance_namespace_urllib3_client.api_client import ApiClient  # a submodule first, as a REST client would
        from lance_namespace_urllib3_client import TableApi
        print(skipped, hit, ApiClient.__name__, TableApi.__name__, "lance_namespace_urllib3_client.api" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1", "ApiClient", "TableApi", "True"]


def test_a_failed_init_runs_again_on_the_next_look_up(tmp_path, monkeypatch):
    root = tmp_path / "flaky_t"
    root.mkdir()
    (root / "__init__.py").write_text(
        "import builtins\nbuiltins.FLAKY_RUNS = getattr(builtins, 'FLAKY_RUNS', 0) + 1\nif builtins.FLAKY_RUNS == 1:\n    raise KeyboardInterrupt\nB = 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    monkeypatch.setattr(builtins, "FLAKY_RUNS", 0, raising=False)
    assert defer_package_init("flaky_t")
    with pytest.raises(KeyboardInterrupt):
        sys.modules["flaky_t"].B  # noqa: B018 - the look-up is the test
    assert sys.modules["flaky_t"].B == 2 and getattr(builtins, "FLAKY_RUNS") == 2  # noqa: B009 - set by the package
    del sys.modules["flaky_t"]


def test_a_submodule_that_imports_from_the_package_does_not_run_the_init(package, tmp_path):
    (tmp_path / "slowpkg_t" / "rest.py").write_text("X = 1\n")
    (tmp_path / "slowpkg_t" / "client.py").write_text("from slowpkg_t import rest\nfrom slowpkg_t.api import Client\n")
    # the __init__ imports client too, as the REST client's does (api -> api_client -> `from pkg import rest`)
    (tmp_path / "slowpkg_t" / "__init__.py").write_text((tmp_path / "slowpkg_t" / "__init__.py").read_text() + "from slowpkg_t.client import Client as C2\n")
    assert defer_package_init(package)
    from slowpkg_t.client import Client  # pyright: ignore[reportMissingImports]

    assert _runs() == 0 and sys.modules[package].C2 is Client and _runs() == 1


def test_a_second_thread_waits_for_the_init(tmp_path, monkeypatch):
    import threading
    import time

    root = tmp_path / "slowinit_t"
    root.mkdir()
    (root / "__init__.py").write_text("import time\nA = 1\ntime.sleep(0.5)\nB = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert defer_package_init("slowinit_t")
    mod = sys.modules["slowinit_t"]
    seen = {}
    first = threading.Thread(target=lambda: seen.setdefault("a", mod.A))
    first.start()
    time.sleep(0.1)
    seen["b"] = mod.B
    first.join()
    assert seen == {"a": 1, "b": 2}
    del sys.modules["slowinit_t"]


def test_python_warnings_still_show_after_the_secret_scanner_is_loaded():
    """detect-secrets calls logging.captureWarnings(True) at import; redaction loads it on first need
    and must not leave every later warning of the process going nowhere."""
    code = textwrap.dedent(
        """
        import sys, warnings
        from memory_pipeline.extraction.redact import redact
        text, found = redact("aws_access_key_id = AKIAIOSFODNN7FAKE123 and token ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8")
        print(found > 0, "detect_secrets" in sys.modules)
        warnings.warn("still-shown-warning")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
    assert "still-shown-warning" in out.stderr
