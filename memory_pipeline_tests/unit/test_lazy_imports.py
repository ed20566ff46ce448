"""memory_pipeline.lazy_imports: a package registered with its __init__ deferred loads its
submodules without it and runs it, once, on the first other look-up."""

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
        from lance_namespace_urllib3_client import ApiClient
        print(skipped, hit, ApiClient.__name__, "lance_namespace_urllib3_client.api" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "1", "ApiClient", "True"]
