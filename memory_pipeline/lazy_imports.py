"""Start-up: a third-party package whose ``__init__`` is slow and that we only use parts of.

``import lancedb`` imports ``lance_namespace``, which imports models from
``lance_namespace_urllib3_client`` (the REST namespace's generated client). That package's
``__init__`` imports every API class of the REST client, and each API method is wrapped in
pydantic's ``validate_call``, which builds its validator at import: about 0.8 s of every
`memory` process's start-up (half of ``import lancedb``), for a client this project never calls.

:func:`defer_package_init` registers such a package without running its ``__init__``: its
submodules (``lance_namespace_urllib3_client.models…``, what lancedb imports) load as usual
through the package's ``__path__``, and the first look-up of anything else on the package itself
(``from lance_namespace_urllib3_client import ApiClient``, ``pkg.__version__``) runs the real
``__init__`` then, in place, so nothing that uses it sees a difference but when the time is paid.
A name that is a submodule (``from lance_namespace_urllib3_client import rest``, as the client's
own modules write) imports just that submodule. The ``__init__`` runs under a lock (another thread
waits for it rather than seeing it half-run), and one that fails leaves the package deferred, so
the next look-up runs it again, as a failed import would.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

# Looked up on modules by tooling (inspect, pickling, doctest) without meaning to use the package.
_PROBES = frozenset({"__wrapped__", "__file__", "__cached__", "__builtins__", "__loader__", "__path__", "__spec__", "__package__", "__name__"})
_LOCK = threading.RLock()  # one __init__ at a time; other threads wait for it rather than see it half-run


class _Deferred(types.ModuleType):
    """A package whose ``__init__`` runs on the first attribute it does not have yet."""

    def __getattr__(self, name: str):
        if name in _PROBES:
            raise AttributeError(name)
        # A submodule (``from pkg import rest`` in the package's own modules, importlib's fromlist
        # probe): import just it, as the import system would, and leave the __init__ alone.
        if not name.startswith("__") and importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            return importlib.import_module(f"{self.__name__}.{name}")
        with _LOCK:
            if type(self) is _Deferred and not self.__dict__.get("__deferred_running__"):
                self.__dict__["__deferred_running__"] = True
                try:
                    spec = self.__spec__
                    assert spec is not None and spec.loader is not None  # set by defer_package_init
                    spec.loader.exec_module(self)
                finally:  # on an error (or Ctrl-C) it stays deferred: the next look-up runs it again
                    del self.__dict__["__deferred_running__"]
                object.__setattr__(self, "__class__", types.ModuleType)
        return types.ModuleType.__getattribute__(self, name)


def defer_package_init(name: str) -> bool:
    """Register package ``name`` with its ``__init__`` deferred (see the module's doc); False when it
    is already imported, not installed, or not a package (then nothing changes)."""
    if name in sys.modules:
        return False
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return False
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _Deferred
    sys.modules[name] = module
    return True


def defer_slow_packages() -> None:
    """The packages this project defers (called once, when ``memory_pipeline`` is imported)."""
    defer_package_init("lance_namespace_urllib3_client")
