"""The YAML configuration: pydantic v2 dataclasses (frozen, unknown keys refused), loaded lazily.

Resolution of the file: an explicit path (``--config``), else the
``MEMORY_PIPELINE_CONFIG`` environment variable, else ``./memory_pipeline.yaml``.
Relative paths inside the file are resolved against the file's own folder, so a
config works from any working directory.

Every field's type and range is declared on its dataclass; pydantic checks them and
:func:`settings_from_dict` turns the first failure into one ``ConfigError`` line that
names the key (``chunking.tokens must be between 32 and 8192``). Before pydantic sees the
mapping, anything that looks like a secret is refused without being echoed, and values
shown in messages are masked when they hold one. The classes are real dataclasses
(positional construction, ``dataclasses.asdict``/``replace``), validated on construction too.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
import yaml
from pydantic import ConfigDict, Field, Strict, TypeAdapter, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import PydanticCustomError

from memory_pipeline.errors import ConfigError

CONFIG_ENV_VAR = "MEMORY_PIPELINE_CONFIG"
DEFAULT_CONFIG_NAME = "memory_pipeline.yaml"

Provider = Literal["auto", "local", "openai", "gemini", "voyage", "mistral", "ollama", "none"]
RemoteProvider = Literal["openai", "gemini", "voyage", "mistral", "ollama"]
FallbackProvider = Literal["local", "openai", "gemini", "voyage", "mistral", "ollama"]
Fusion = Literal["weighted", "rrf"]
AnnIndexType = Literal["IVF_HNSW_SQ", "IVF_PQ", "IVF_FLAT"]
LocalRuntime = Literal["torch", "onnx", "openvino"]
LocalQuantize = Literal["auto", "none", "int8"]
MediaType = Literal["image", "audio", "video", "pdf", "document"]

KNOWN_PROVIDERS: tuple[str, ...] = typing.get_args(Provider)
REMOTE_PROVIDERS: tuple[str, ...] = typing.get_args(RemoteProvider)
FUSIONS: tuple[str, ...] = typing.get_args(Fusion)
ANN_INDEX_TYPES: tuple[str, ...] = typing.get_args(AnnIndexType)
MEDIA_TYPES: tuple[str, ...] = typing.get_args(MediaType)
NATIVE_MODEL = "gemini-embedding-2-preview"

DEFAULT_DATA_DIR = "data/index"  # in the file; code building Settings passes data_dir
DEFAULT_INCLUDE = ("**/*",)
DEFAULT_EXCLUDE = ("**/.*", "**/.*/**", "**/node_modules/**", "**/__pycache__/**")

_SECRET_KEY_RE = re.compile(r"(api[_-]?key|secret|token|password)$", re.IGNORECASE)
# A memory_pipeline.yaml is a few KB; a bigger file is a mistake or an attack, and is
# refused before it is parsed.
MAX_CONFIG_BYTES = 1024 * 1024
_NOT_SHOWN = "<value not shown>"

# Field types. Strict: YAML `tokens: "400"` or `enabled: yes-as-a-string` is an error, not a guess;
# an int is still a valid float. NaN and infinities are refused (allow_inf_nan below).
PositiveInt = Annotated[int, Strict(), Field(ge=1)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
NonNegativeNumber = Annotated[float, Strict(), Field(ge=0)]
PositiveNumber = Annotated[float, Strict(), Field(gt=0)]
Share = Annotated[float, Strict(), Field(ge=0, le=1)]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

_MODEL = ConfigDict(extra="forbid", allow_inf_nan=False)


def _bad(text: str, *, sub: tuple[str | int, ...] = (), form: str = "key", hint: str = "") -> PydanticCustomError:
    """A validation failure with our own wording.

    ``sub`` extends the location (a cross-field check on a section names the field at fault);
    ``form`` says how the message is framed: ``key`` ("<file>: <key> <text>"), ``whole``
    ("<file>: <text>") or ``bare`` (``text`` alone).
    """
    return PydanticCustomError("setting", "{text}", {"text": text, "sub": sub, "form": form, "hint": hint})


def _path(value: Any, info: ValidationInfo) -> Any:
    """A path string from the file, resolved against the file's folder (``context['base_dir']``)."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value:
        raise _bad("must be a path string")
    path = Path(os.path.expandvars(value)).expanduser()
    base_dir = (info.context or {}).get("base_dir")
    if base_dir is None or path.is_absolute():
        return path.resolve() if base_dir is not None else path
    return (Path(base_dir) / path).resolve()


def _globs(value: Any) -> Any:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise _bad("must be a list of glob strings")
    for v in value:
        # Globs match paths relative to the source folder (``notes/a.md``): one that is absolute or
        # steps through ``.`` or ``..`` can match nothing, and selected nothing without a word.
        if v.startswith("/") or any(part in (".", "..") for part in v.split("/")):
            raise _bad(f"has {_shown(v)}: globs match paths relative to the source folder (notes/*.md, **/*.md), with no leading /, ./ or ..")
    return tuple(value)


def _check_url(value: str) -> str:
    if value and not re.match(r"^https?://[^\s/]+", value):
        raise _bad(f"must be an http(s) URL, got {_shown(value)}")
    if value and re.match(r"^https?://[^/]*@", value):
        raise _bad("must not carry credentials; use the provider's environment variable")
    return value


@dataclass(frozen=True, config=_MODEL)
class SourceConfig:
    name: Str
    path: Path
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE

    @field_validator("name")
    @classmethod
    def _word(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
            raise _bad("must be a word (letters, digits, _ . -)")
        return value

    _path = field_validator("path", mode="before")(_path)
    _globs = field_validator("include", "exclude", mode="before")(_globs)


@dataclass(frozen=True, config=_MODEL)
class ChunkingConfig:
    tokens: Annotated[int, Strict(), Field(ge=32, le=8192)] = 400
    overlap: NonNegativeInt = 80

    @model_validator(mode="after")
    def _overlap_below_tokens(self) -> ChunkingConfig:
        if self.overlap >= self.tokens:
            raise _bad("must be >= 0 and smaller than chunking.tokens", sub=("overlap",))
        return self


@dataclass(frozen=True, config=_MODEL)
class CacheConfig:
    enabled: Bool = True
    max_entries: PositiveInt = 200_000


@dataclass(frozen=True, config=_MODEL)
class QueryConfig:
    max_results: PositiveInt = 6
    min_score: Share = 0.5
    vector_weight: NonNegativeNumber = 0.5
    text_weight: NonNegativeNumber = 0.5
    fusion: Fusion = "weighted"  # weighted (each leg standardized over the query's candidates, then averaged) | rrf
    rrf_k: PositiveInt = 60
    candidate_multiplier: PositiveInt = 4  # each leg's candidate pool = max_results x this (at least 20)
    mmr: Bool = False  # diversity: maximal marginal relevance over the fused results
    mmr_lambda: Share = 0.7  # 1 = pure relevance, 0 = pure diversity
    recency_half_life_days: NonNegativeNumber = 0.0  # 0 = off; else dated notes lose half their score per half-life

    @model_validator(mode="after")
    def _some_weight(self) -> QueryConfig:
        if self.vector_weight + self.text_weight == 0:
            raise _bad("and query.text_weight must not both be 0", sub=("vector_weight",))
        return self


@dataclass(frozen=True, config=_MODEL)
class LocalConfig:
    """How the local model runs: the engine, its weights' precision and the batch size in tokens.

    The runtime is part of the table's identity: changing it builds a new table generation.
    """

    runtime: LocalRuntime = "onnx"  # torch | onnx | openvino (ONNX/OpenVINO exported once, cached)
    quantize: LocalQuantize = "auto"  # auto (int8 with onnx, else none) | none | int8 (onnx or openvino only)
    batch_tokens: Annotated[int, Strict(), Field(ge=64, le=1_048_576)] | None = None  # padded tokens per batch; default 32 x the model limit

    @model_validator(mode="after")
    def _int8_engine(self) -> LocalConfig:
        if self.runtime == "torch" and self.quantize == "int8":
            raise _bad("int8 needs local.runtime onnx or openvino", sub=("quantize",))
        return self

    @property
    def quantization(self) -> str:
        """``quantize`` resolved: ``auto`` is int8 with onnx (the fastest runtime within issue 15's
        1-point quality bound on the dev sets, README *Local model runtimes*), none otherwise."""
        if self.quantize == "auto":
            return "int8" if self.runtime == "onnx" else "none"
        return self.quantize

    @property
    def engine(self):
        from memory_pipeline.providers.runtimes import Runtime

        return Runtime(self.runtime, self.quantization)


@dataclass(frozen=True, config=_MODEL)
class AnnConfig:
    """The approximate vector index, built once the table holds ``min_rows`` rows."""

    min_rows: Annotated[int, Strict(), Field(ge=256)] = 50_000
    index_type: AnnIndexType = "IVF_HNSW_SQ"
    nprobes: PositiveInt = 20
    # >0 re-ranks refine_factor x k candidates with exact distances (SQ loses precision). Recall@10
    # against exact search at 1M chunks (bench_search.py): 0 -> 0.73, 5 -> 0.915, 10 -> 0.956,
    # 20 -> 0.978 for 3 ms more per query (9.0 ms); twice the nprobes added nothing.
    refine_factor: NonNegativeInt = 20


@dataclass(frozen=True, config=_MODEL)
class FtsConfig:
    """The native full-text index (ICU word segmentation, so CJK text is searchable)."""

    stem: Bool = True
    language: Str = "English"
    ascii_folding: Bool = True


@dataclass(frozen=True, config=_MODEL)
class LimitsConfig:
    max_file_bytes: PositiveInt = 20 * 1024 * 1024
    # Output of one file, any format: past either cap it is indexed in part, with a warning.
    max_segments_per_file: PositiveInt = 50_000
    max_chars_per_file: PositiveInt = 20_000_000


@dataclass(frozen=True, config=_MODEL)
class MultimodalConfig:
    """Media files: derived text (OCR, EXIF, transcripts, page text) always; native vectors on request."""

    enabled: Bool = True
    max_file_bytes: PositiveInt = 20 * 1024 * 1024  # raw bytes; base64 toward an API adds a third
    types: tuple[str, ...] = MEDIA_TYPES
    native: Bool = False  # also embed the media bytes (gemini-embedding-2-preview only)
    pdf_max_pages: PositiveInt = 100
    keyframe_seconds: PositiveNumber = 10.0  # video: OCR one frame every N seconds
    timeout_seconds: PositiveNumber = 300.0  # per file, extraction
    max_image_pixels: PositiveInt = 64_000_000  # larger images are refused as decompression bombs
    # The worker extracting a media file or document is killed past these (0 = timeout_seconds + 10 s).
    max_extract_seconds: NonNegativeNumber = 0.0
    max_extract_mb: PositiveInt = 1024
    # Zip containers (docx) are refused before parsing when they would expand past these.
    max_unzipped_bytes: PositiveInt = 100 * 1024 * 1024
    max_zip_ratio: PositiveNumber = 100.0

    @field_validator("types", mode="before")
    @classmethod
    def _media_types(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or any(t not in MEDIA_TYPES for t in value):
            raise _bad(f"must be a list of {', '.join(MEDIA_TYPES)}, got {_shown(value)}")
        return tuple(dict.fromkeys(value))


@dataclass(frozen=True, config=_MODEL)
class ChecksConfig:
    min_coverage: Share = 0.9  # share of indexable files that must be indexed


@dataclass(frozen=True, config=_MODEL)
class ServiceConfig:
    """`memory serve`: where it listens and what it allows; its command-line flags override these."""

    host: Str = "127.0.0.1"  # anything but loopback needs $MEMORY_PIPELINE_TOKEN
    port: Annotated[int, Strict(), Field(ge=0, le=65535)] = 8765  # 0 = any free port
    assets_source: Str | None = None  # the source ingested assets are written to (None: the first)
    cors_origins: tuple[Str, ...] = ()  # browser origins allowed (CORS is off when empty)
    # While a server is up for the data folder, index runs raise their nice value to this so
    # its searches get the CPU first (0: off); see memory_pipeline/priority.py.
    index_nice: Annotated[int, Strict(), Field(ge=0, le=19)] = 10


@dataclass(frozen=True, config=_MODEL)
class RemoteBatchConfig:
    """Provider batch APIs (file upload, job, poll, results); used by providers/batch support."""

    enabled: Bool = False
    wait: Bool = True
    concurrency: PositiveInt = 2
    poll_interval_ms: PositiveInt = 30_000
    timeout_ms: PositiveInt = 24 * 3600 * 1000


@dataclass(frozen=True, config=_MODEL)
class ProviderOverrides:
    """``remote.providers.<name>``: what differs for one provider (0 / empty = the remote.* value)."""

    base_url: Str = ""
    requests_per_minute: NonNegativeInt = 0
    tokens_per_minute: NonNegativeInt = 0
    concurrency: NonNegativeInt = 0

    _url = field_validator("base_url")(_check_url)


@dataclass(frozen=True, config=_MODEL)
class RemoteConfig:
    """Live calls to remote embedding APIs: endpoint, timeouts, concurrency, rate limits, retries.

    ``base_url`` applies to the provider in use (``provider:``, or the one ``auto`` picks);
    ``providers.<name>.base_url`` to one provider whatever is selected (e.g. the fallback).
    Rate limits of 0 mean none; each provider has its own limiter.
    """

    base_url: Str = ""
    timeout_ms: PositiveInt = 60_000  # one indexing request
    query_timeout_ms: PositiveInt = 15_000  # the query embedding of a search
    concurrency: PositiveInt = 4  # requests in flight at once, per provider
    requests_per_minute: NonNegativeInt = 0
    tokens_per_minute: NonNegativeInt = 0
    max_retries: NonNegativeInt = 6  # per request, on 429 / 5xx / timeouts / resource exhausted
    backoff_base_ms: NonNegativeInt = 500
    backoff_max_ms: NonNegativeInt = 60_000
    batch_size: NonNegativeInt = 0  # texts per request; 0 = the provider's own maximum
    providers: dict[str, ProviderOverrides] = field(default_factory=dict)
    batch: RemoteBatchConfig = field(default_factory=RemoteBatchConfig)

    _url = field_validator("base_url")(_check_url)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        # `remote:` lists its keys commented or as `key: null` in the shipped config: null = the default.
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("providers", mode="before")
    @classmethod
    def _remote_names(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise _bad("must be a mapping of provider names")
        for name in value:
            if name not in REMOTE_PROVIDERS:
                raise _bad(f": not a remote provider ({', '.join(REMOTE_PROVIDERS)})", sub=(str(name),))
        return {name: {} if item is None else item for name, item in value.items()}

    def for_provider(self, name: str, *, primary: bool) -> ResolvedRemote:
        """The effective settings for one provider (its overrides, else the remote.* values)."""
        o = self.providers.get(name, ProviderOverrides())
        return ResolvedRemote(
            base_url=o.base_url or (self.base_url if primary else ""),
            timeout_s=self.timeout_ms / 1000,
            query_timeout_s=self.query_timeout_ms / 1000,
            concurrency=o.concurrency or self.concurrency,
            requests_per_minute=o.requests_per_minute or self.requests_per_minute,
            tokens_per_minute=o.tokens_per_minute or self.tokens_per_minute,
            max_retries=self.max_retries,
            backoff_base_s=self.backoff_base_ms / 1000,
            backoff_max_s=self.backoff_max_ms / 1000,
            batch_size=self.batch_size,
        )


@dataclasses.dataclass(frozen=True)
class ResolvedRemote:
    """What one provider's client uses; derived from validated settings, so not validated again."""

    base_url: str = ""
    timeout_s: float = 60.0
    query_timeout_s: float = 15.0
    concurrency: int = 4
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_retries: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 60.0
    batch_size: int = 0


SOURCES_MESSAGE = "'sources' must be a non-empty list of {name, path}"


@dataclass(frozen=True, config=_MODEL)
class Settings:
    """Everything the YAML file decides: what to index and how."""

    data_dir: Path | str  # a folder, or an object-storage URL (s3://bucket/prefix): see storage.py
    sources: tuple[SourceConfig, ...]
    provider: Provider = "auto"
    model: Str | None = None
    dims: Annotated[int, Strict(), Field(ge=1, le=16384)] | None = None  # output size for models that offer a choice
    fallback: FallbackProvider | None = None  # the provider used when the primary cannot start or fails permanently
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    multimodal: MultimodalConfig = field(default_factory=MultimodalConfig)
    table_name: Str = "memory_vectors"
    ann: AnnConfig = field(default_factory=AnnConfig)
    fts: FtsConfig = field(default_factory=FtsConfig)
    local_dir: Path | None = None  # with an s3:// data_dir: this machine's cache, locks, Dagster instance, analytics file
    config_path: Path | None = None  # where it was read from; not a key of the file

    @field_validator("local_dir", mode="before")
    @classmethod
    def _local_dir(cls, value: Any, info: ValidationInfo) -> Any:
        return None if value is None else _path(value, info)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir(cls, value: Any, info: ValidationInfo) -> Any:
        from memory_pipeline import storage

        if isinstance(value, str) and "://" in os.path.expandvars(value):
            url = os.path.expandvars(value)  # data_dir: ${MEMORY_BUCKET}/agents
            if not storage.is_url(url):
                raise _bad("must be a folder or an s3://bucket/prefix URL")
            try:
                return storage.check_url(url)
            except ValueError as err:
                raise _bad(str(err)) from None
        return _path(value, info)

    @field_validator("remote", "local", "chunking", "cache", "query", "limits", "checks", "service", "multimodal", "ann", "fts", mode="before")
    @classmethod
    def _null_section(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("sources", mode="before")
    @classmethod
    def _sources_list(cls, value: Any, info: ValidationInfo) -> Any:
        # A file must name a source; code (tests, eval) may build Settings without one.
        if not isinstance(value, (list, tuple)) or (not value and info.context is not None):
            raise _bad(SOURCES_MESSAGE, form="whole")
        return value

    @field_validator("sources")
    @classmethod
    def _unique_names(cls, value: tuple[SourceConfig, ...]) -> tuple[SourceConfig, ...]:
        seen: set[str] = set()
        for i, src in enumerate(value):
            if src.name in seen:
                raise _bad(f"source name {_shown(src.name)} is used twice", sub=(i, "name"), form="whole")
            seen.add(src.name)
        return value

    @field_validator("table_name")
    @classmethod
    def _table_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_]+", value):
            raise _bad("must be letters, digits and _")
        return value

    @model_validator(mode="after")
    def _across_sections(self) -> Settings:
        if self.local_dir is not None and not isinstance(self.data_dir, str):
            raise _bad("is only for an s3:// data_dir (a local data_dir holds everything itself)", sub=("local_dir",))
        if self.multimodal.native and self.multimodal.enabled:
            _check_native(self.provider, self.model)
        if self.fallback is not None and self.fallback == self.provider:
            raise _bad(f"is the same provider as provider ({self.provider})", sub=("fallback",))
        if not isinstance(self.data_dir, str):
            for src in self.sources:
                if os.path.realpath(src.path) == os.path.realpath(self.data_dir):
                    # Inside a source it is fine (the walk never enters it); as the source itself, the notes would live among the index's files.
                    raise _bad(
                        f"is the folder of source {_shown(src.name)}: give the index a folder of its own (inside it is fine, e.g. data_dir: {_shown(str(Path(src.path) / '.memory-index'), quote=False)})",
                        sub=("data_dir",),
                    )
        if self.remote.batch.enabled and not self.cache.enabled:
            # Batch results wait in the cache until every file that needs them is written (and a resumed run finds them there).
            raise _bad("needs cache.enabled: true", sub=("remote", "batch", "enabled"))
        return self

    # Paths under the data folder belong to the storage layer (memory_pipeline/storage.py);
    # these read them from there, for callers that hold only the settings.
    @property
    def assets_dir(self) -> Path:
        return self._data().assets_dir

    @property
    def lancedb_uri(self) -> str:
        return self._data().lancedb_uri

    @property
    def cache_path(self) -> Path:
        return self._data().cache_path

    @property
    def dagster_home(self) -> Path:
        return self._data().dagster_home

    @property
    def runs_dir(self) -> Path:
        return self._data().runs_dir

    def _data(self):
        from memory_pipeline import storage

        return storage.of(self)

    def source(self, name: str) -> SourceConfig:
        for src in self.sources:
            if src.name == name:
                return src
        raise ConfigError(f"unknown source {_shown(name)}", key="sources")


def _check_native(provider: Any, model: Any) -> None:
    # Checked before provider availability: the answer is the same whichever providers this build has.
    if provider != "gemini" or model != NATIVE_MODEL:
        current = _shown(provider, quote=False) if provider != "gemini" else f"gemini ({_shown(model, quote=False) if model else 'its default model'})"
        # The exact wording is promised (README): no hint appended; the README says what to set.
        raise _bad(
            f"Multimodal embedding requires {NATIVE_MODEL}. Current provider: {current}",
            sub=("multimodal", "native"),
            form="bare",
            hint=ConfigError.NO_HINT,
        )


_SETTINGS = TypeAdapter(Settings)
_NOT_KEYS = frozenset({"config_path"})  # Settings fields that the file may not set


# --- loading -----------------------------------------------------------------------------


def resolve_config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: explicit path, then the env var, then ./memory_pipeline.yaml."""
    if explicit is not None and not str(explicit).strip():
        # An empty --config (an unset shell variable, `--config "$CFG"`) had fallen back to ./memory_pipeline.yaml.
        raise ConfigError("the config file's path is empty", hint=f"pass --config FILE or set {CONFIG_ENV_VAR}")
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get(CONFIG_ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.cwd() / DEFAULT_CONFIG_NAME).resolve()


class _AliasRefused(yaml.YAMLError):
    """The document uses an anchor or alias; carries where, like PyYAML's own errors."""

    def __init__(self, mark: yaml.Mark | None) -> None:
        super().__init__("the config may not use YAML anchors/aliases")
        self.problem_mark = mark


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases.

    Aliases let a few lines stand for billions of nodes ("billion laughs"): PyYAML
    shares them cheaply, but every walk over the result (validation, error messages)
    visits each one. A config has no need for them, so the first one stops the load.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AliasRefused(event.start_mark)
        return super().compose_node(parent, index)


def read_config_text(cfg_path: Path) -> str:
    """The file's text: at most 1 MiB, UTF-8; anything else is a ConfigError naming the file."""
    try:
        with cfg_path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)  # no more than the cap is ever read
    except OSError as err:
        raise ConfigError(f"{cfg_path}: cannot read the config file ({err.strerror or type(err).__name__})", path=str(cfg_path)) from err
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{cfg_path}: the config file is larger than {MAX_CONFIG_BYTES // 1024 // 1024} MiB; a memory_pipeline.yaml is a few KB",
            path=str(cfg_path),
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{cfg_path}: not UTF-8 text", path=str(cfg_path)) from err


def parse_yaml(text: str, where: str, *, compose: bool = False) -> Any:
    """Plain YAML (no anchors, aliases or tags that build objects); the parsed data, or its node tree."""
    loader = None
    try:
        loader = _NoAliasLoader(text)  # the reader refuses control characters here already
        return loader.get_single_node() if compose else loader.get_single_data()
    except _AliasRefused as err:
        mark = err.problem_mark
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{where}: the config may not use YAML anchors/aliases{at}", path=where) from err
    except RecursionError as err:
        raise ConfigError(f"{where}: not valid YAML: nested too deeply", path=where) from err
    except yaml.YAMLError as err:
        # Only the position and the problem: the offending line may hold a secret.
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or getattr(err, "reason", None) or "syntax error"
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}", path=where) from err
    finally:
        if loader is not None:
            loader.dispose()


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read and validate the YAML file; raises ConfigError with the key at fault."""
    cfg_path = resolve_config_path(path)
    if not cfg_path.is_file():
        raise ConfigError(
            f"config file {'is a folder' if cfg_path.is_dir() else 'not found'}: {cfg_path}",
            path=str(cfg_path),
            hint=f"pass --config FILE or set {CONFIG_ENV_VAR}",
        )
    raw = parse_yaml(read_config_text(cfg_path), str(cfg_path))
    return settings_from_dict({} if raw is None else raw, base_dir=cfg_path.parent, config_path=cfg_path)


def settings_from_dict(raw: Any, *, base_dir: Path, config_path: Path | None = None) -> Settings:
    """Validate a parsed YAML mapping into Settings (relative paths against ``base_dir``)."""
    where = str(config_path or "<config>")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping", path=where)
    _refuse_secrets(raw, where)
    _refuse_odd_names(raw, where)
    try:
        settings = _SETTINGS.validate_python({"data_dir": DEFAULT_DATA_DIR, **raw}, context={"base_dir": base_dir})
    except ValidationError as err:
        raise _config_error(err, where) from err
    return dataclasses.replace(settings, config_path=config_path) if config_path is not None else settings


def settings_as_dict(settings: Settings) -> dict[str, Any]:
    """Every setting (defaults included) as plain JSON/YAML data, in the order of the model."""
    data = _SETTINGS.dump_python(settings, mode="json")
    for key in _NOT_KEYS:
        data.pop(key, None)
    return data


# --- errors ------------------------------------------------------------------------------

_EXPECTED = {
    "int": "an integer", "float": "a number", "bool": "true or false", "string": "a string", "dict": "a mapping",
    "dataclass": "a mapping", "mapping": "a mapping", "tuple": "a list", "list": "a list", "iterable": "a list",
    "path": "a path string", "finite": "a finite number", "literal": "",
}  # fmt: skip


def _config_error(err: ValidationError, where: str) -> ConfigError:
    """The first problem pydantic found, as one line naming the key."""
    problems = err.errors(include_url=False)
    # An unknown key first: a typo'd name explains the other complaints about that section.
    e = next((p for p in problems if p["type"] in ("unexpected_keyword_argument", "extra_forbidden")), problems[0])
    ctx = e.get("ctx") or {}
    loc = [*e["loc"], *(ctx.get("sub") or ())] if e["type"] == "setting" else list(e["loc"])
    key = _dotted(loc)
    kind, value = e["type"], e.get("input")
    hint = ""
    if kind == "setting":
        text, hint = ctx["text"], ctx.get("hint", "")
        if ctx.get("form") == "bare":
            return ConfigError(text, key=key, hint=hint)
        message = text if ctx.get("form") == "whole" else f"{key}{'' if text.startswith(':') else ' '}{text}"
    elif kind in ("unexpected_keyword_argument", "extra_forbidden"):
        message = f"unknown setting {_shown(key)} (allowed: {', '.join(_allowed(_owner(loc[:-1])))})"
    elif kind in ("missing_argument", "missing"):
        message = SOURCES_MESSAGE if key == "sources" else f"{key} is required"
    elif kind == "literal_error":
        choices = typing.get_args(_unwrap(_annotation(loc))) or (ctx.get("expected"),)
        message = f"{key} must be one of {', '.join(map(str, choices))}, got {_shown(value)}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        message = f"{key} must be {_range(_annotation(loc))}"
    elif kind.split("_")[0] in _EXPECTED:
        message = f"{key} must be {_EXPECTED[kind.split('_')[0]]}, got {_shown(value)}"
    else:  # a check pydantic words itself; still one line with the key
        message = f"{key}: {e['msg'][:1].lower()}{e['msg'][1:]}"
    return ConfigError(f"{where}: {message}", key=key, path=where, hint=hint)


def _refuse_odd_names(node: Any, where: str, prefix: str = "") -> None:
    """Setting names are strings (YAML also allows `1:`, `null:`, `true:`), and config_path is not one."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not prefix and key in _NOT_KEYS:
                raise ConfigError(f"{where}: unknown setting {key!r} (allowed: {', '.join(_allowed(Settings))})", key=key, path=where)
            if not isinstance(key, str):
                name = f"{prefix}{_shown(key, quote=False)}"
                raise ConfigError(f"{where}: unknown setting {name!r}: setting names are words", key=name, path=where)
            _refuse_odd_names(value, where, f"{prefix}{key}.")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _refuse_odd_names(value, where, f"{prefix[:-1]}[{i}].")


def _dotted(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(annotation: Any) -> Any:
    """``X`` of ``X | None``, ``tuple[X, ...]``, ``dict[str, X]`` and ``Annotated[X, ...]``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        else:
            return annotation


def _walk(loc: list[Any]) -> tuple[Any, Any]:
    """(the dataclass holding the last field of ``loc``, that field's annotation)."""
    owner: Any = Settings
    annotation: Any = Settings
    for part in loc:
        inner = _unwrap(annotation)
        if isinstance(part, str) and dataclasses.is_dataclass(inner):
            fields = getattr(inner, "__pydantic_fields__", {})
            if part not in fields:
                return owner, None
            owner, annotation = inner, _field_annotation(fields[part])
        elif typing.get_origin(inner) in (tuple, dict):
            annotation = typing.get_args(inner)[-1 if typing.get_origin(inner) is dict else 0]
    return owner, annotation


def _field_annotation(info: Any) -> Any:
    # pydantic keeps Annotated metadata aside from the annotation; put it back for _range.
    return Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation


def _owner(loc: list[Any]) -> Any:
    _, annotation = _walk(loc)
    return _unwrap(annotation) if loc else Settings


def _annotation(loc: list[Any]) -> Any:
    return _walk(loc)[1]


def _allowed(cls: Any) -> list[str]:
    fields = getattr(cls, "__pydantic_fields__", {})
    return sorted(k for k in fields if k not in _NOT_KEYS)


def _range(annotation: Any) -> str:
    bounds: dict[str, Any] = {}
    stack = [annotation]
    while stack:
        a = stack.pop()
        if typing.get_origin(a) is Annotated:
            for m in typing.get_args(a)[1:]:
                stack.extend(getattr(m, "metadata", ()))  # a pydantic FieldInfo
                stack.append(m)
            stack.append(typing.get_args(a)[0])
        elif typing.get_origin(a) in (typing.Union, types.UnionType):
            stack.extend(typing.get_args(a))
        elif isinstance(a, annotated_types.BaseMetadata):
            bounds.update({k: getattr(a, k) for k in ("ge", "gt", "le", "lt") if hasattr(a, k)})
    if "ge" in bounds and "le" in bounds:
        return f"between {bounds['ge']} and {bounds['le']}"
    parts = [f"{op} {bounds[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if k in bounds]
    return " and ".join(parts) or "in range"


# --- secrets -----------------------------------------------------------------------------


def _refuse_secrets(node: Any, where: str, prefix: str = "") -> None:
    # Keys belong in environment variables only; a key in the file would end up on disk
    # and in backups, and a key pasted into the wrong field (model: sk-...) would be echoed
    # by an error message or shown by `memory status`. Checked before any other
    # validation, so no later message can quote one.
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and _looks_like_secret(key):
                parent = prefix[:-1]
                raise ConfigError(
                    f"{where}: a setting name {'under ' + parent if parent else 'at the top level'} looks like an API key "
                    "or secret; put keys in environment variables (name not shown)",
                    key=parent,
                    path=where,
                    hint="remove it from the file and export it as an environment variable",
                )
            dotted = f"{prefix}{key}"
            if isinstance(key, str) and _SECRET_KEY_RE.search(key) and value not in (None, ""):
                raise ConfigError(
                    f"{where}: '{dotted}' looks like a secret; secrets are read only from environment variables",
                    key=dotted,
                    path=where,
                    hint="remove it from the file and export it as an environment variable",
                )
            _refuse_secrets(value, where, dotted + ".")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _refuse_secrets(value, where, f"{prefix[:-1]}[{i}].")
    elif isinstance(node, str) and _looks_like_secret(node):
        key = prefix[:-1]
        raise ConfigError(
            f"{where}: {key or 'the top level'}: looks like an API key or secret; put keys in environment variables (value not shown)",
            key=key,
            path=where,
            hint="remove it from the file and export it as an environment variable",
        )


def _looks_like_secret(value: str) -> bool:
    """Whether a config value is (or holds) an API key, token, password or private key."""
    # Imported on use: the extraction package imports discovery, which imports this module.
    from memory_pipeline.extraction.redact import looks_like_secret as check

    return check(value)


def _holds_secret(value: Any) -> bool:
    if isinstance(value, str):
        return _looks_like_secret(value)
    if isinstance(value, dict):
        return any(_holds_secret(k) or _holds_secret(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_holds_secret(v) for v in value)
    return False


def _shown(value: Any, *, quote: bool = True) -> str:
    """A value as an error message may show it: masked if it holds a secret, cut if long."""
    if _holds_secret(value):
        return _NOT_SHOWN
    text = repr(value) if quote or not str(value).isprintable() else str(value)  # one line, whatever it holds
    return text if len(text) <= 80 else text[:77] + "..."
