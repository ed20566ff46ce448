"""Errors raised by memory_pipeline.

One root, one branch per layer; lower-layer exceptions are translated at the
boundary and chained (``raise X(...) from err``)::

    MemoryPipelineError
    ├── ConfigError          the YAML file or a CLI flag is invalid (carries ``key``)
    ├── ExtractionError      one file could not be read or parsed (carries ``path``, ``reason``)
    ├── ProviderError        an embedding provider failed (carries ``provider``, ``status``)
    │   ├── ProviderUnavailable  the provider cannot start (missing package, model or key)
    │   └── PrimaryFailed        the primary failed permanently; the fallback takes over
    ├── SearchError          a search could not be answered (carries ``query``)
    │   └── FullTextUnavailable  full-text cannot answer this query on this table; the search goes on without it
    └── StoreError           the LanceDB table or the embedding cache failed
        ├── ObjectStoreError     object storage failed (carries ``permanent``); also an ``OSError``
        └── IndexMismatchError   the table holds vectors of another model or dimension

Per-file failures (``ExtractionError``) are recorded in the manifest and never
abort a run; everything else stops the run with a one-line message.
"""

from __future__ import annotations


class MemoryPipelineError(Exception):
    """Root of every error this package raises on purpose."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint or self.hint


class ConfigError(MemoryPipelineError):
    """The configuration is invalid; ``key`` names the offending setting."""

    NO_HINT = "\0"  # pass as ``hint`` for an error whose wording is promised whole (no hint appended)

    def __init__(self, message: str, *, key: str = "", path: str = "", hint: str = "") -> None:
        super().__init__(message, hint=hint or "fix the configuration file and run again")
        if hint == self.NO_HINT:
            self.hint = ""
        self.key = key
        self.path = path


class ExtractionError(MemoryPipelineError):
    """One file could not be turned into text."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ProviderError(MemoryPipelineError):
    """An embedding provider call failed."""

    def __init__(self, message: str, *, provider: str, status: int | None = None, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.provider = provider
        self.status = status


class ProviderUnavailable(ProviderError):
    """The provider cannot be used at all here (package, model or key missing)."""


class PrimaryFailed(ProviderError):
    """The primary provider failed permanently in a run; the configured fallback takes over."""


class StoreError(MemoryPipelineError):
    """The vector table or the embedding cache failed."""


class ObjectStoreError(StoreError, OSError):
    """A read or write of object storage failed (the store unreachable, access denied, no
    credentials found): an ``OSError`` to the code that retries it or tells it from a missing
    object, and one line with a hint to the user, not "a bug"."""

    hint = "check the AWS credentials and AWS_ENDPOINT_URL in the environment, and that the store is up"

    def __init__(self, message: str, *, permanent: bool = False, hint: str = "") -> None:
        super().__init__(message, hint=hint)
        # True when trying again cannot help (access denied, no such bucket, no credentials):
        # a run fails at once instead of retrying its step.
        self.permanent = permanent


class IndexMismatchError(StoreError):
    """The table was built with another model or dimension."""


class SearchError(MemoryPipelineError):
    """A search could not be answered; ``query`` is the query text."""

    def __init__(self, message: str, *, query: str = "", hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.query = query


class FullTextUnavailable(SearchError):
    """The full-text leg cannot answer this query on this table (e.g. a phrase on an index
    without positions); the searcher answers with the vector leg alone."""
