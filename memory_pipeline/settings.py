"""The YAML configuration: validated into frozen dataclasses, loaded lazily.

Resolution of the file: an explicit path (``--config``), else the
``MEMORY_PIPELINE_CONFIG`` environment variable, else ``./memory_pipeline.yaml``.
Relative paths inside the file are resolved against the file's own folder, so a
config works from any working directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from memory_pipeline.errors import ConfigError

CONFIG_ENV_VAR = "MEMORY_PIPELINE_CONFIG"
DEFAULT_CONFIG_NAME = "memory_pipeline.yaml"

KNOWN_PROVIDERS = ("auto", "local", "openai", "gemini", "voyage", "mistral", "ollama", "none")
REMOTE_PROVIDERS = ("openai", "gemini", "voyage", "mistral", "ollama")

DEFAULT_INCLUDE = ("**/*",)
DEFAULT_EXCLUDE = ("**/.*", "**/.*/**", "**/node_modules/**", "**/__pycache__/**")

_SECRET_KEY_RE = re.compile(r"(api[_-]?key|secret|token|password)$", re.IGNORECASE)
# A memory_pipeline.yaml is a few KB; a bigger file is a mistake or an attack, and is
# refused before it is parsed.
MAX_CONFIG_BYTES = 1024 * 1024
_NOT_SHOWN = "<value not shown>"


@dataclass(frozen=True)
class SourceConfig:
    name: str
    path: Path
    include: tuple[str, ...] = DEFAULT_INCLUDE
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE


@dataclass(frozen=True)
class ChunkingConfig:
    tokens: int = 400
    overlap: int = 80


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    max_entries: int = 200_000


@dataclass(frozen=True)
class QueryConfig:
    max_results: int = 6
    min_score: float = 0.4
    vector_weight: float = 0.7
    text_weight: float = 0.3
    fusion: str = "weighted"  # weighted (noisy-OR of calibrated scores) | rrf
    rrf_k: int = 60
    candidate_multiplier: int = 4  # each leg's candidate pool = max_results x this (at least 20)
    mmr: bool = False  # diversity: maximal marginal relevance over the fused results
    mmr_lambda: float = 0.7  # 1 = pure relevance, 0 = pure diversity
    recency_half_life_days: float = 0.0  # 0 = off; else dated notes lose half their score per half-life


FUSIONS = ("weighted", "rrf")


@dataclass(frozen=True)
class AnnConfig:
    """The approximate vector index, built once the table holds ``min_rows`` rows."""

    min_rows: int = 50_000
    index_type: str = "IVF_HNSW_SQ"
    nprobes: int = 20
    refine_factor: int = 5  # >0 re-ranks refine_factor x k candidates with exact distances (SQ loses precision)


ANN_INDEX_TYPES = ("IVF_HNSW_SQ", "IVF_PQ", "IVF_FLAT")


@dataclass(frozen=True)
class FtsConfig:
    """The native full-text index (ICU word segmentation, so CJK text is searchable)."""

    stem: bool = True
    language: str = "English"
    ascii_folding: bool = True


@dataclass(frozen=True)
class LimitsConfig:
    max_file_bytes: int = 20 * 1024 * 1024
    # Output of one file, any format: past either cap it is indexed in part, with a warning.
    max_segments_per_file: int = 50_000
    max_chars_per_file: int = 20_000_000


MEDIA_TYPES = ("image", "audio", "video", "pdf", "document")
NATIVE_MODEL = "gemini-embedding-2-preview"


@dataclass(frozen=True)
class MultimodalConfig:
    """Media files: derived text (OCR, EXIF, transcripts, page text) always; native vectors on request."""

    enabled: bool = True
    max_file_bytes: int = 20 * 1024 * 1024  # raw bytes; base64 toward an API adds a third
    types: tuple[str, ...] = MEDIA_TYPES
    native: bool = False  # also embed the media bytes (gemini-embedding-2-preview only)
    pdf_max_pages: int = 100
    keyframe_seconds: float = 10.0  # video: OCR one frame every N seconds
    timeout_seconds: float = 300.0  # per file, extraction
    max_image_pixels: int = 64_000_000  # larger images are refused as decompression bombs
    # The worker extracting a media file or document is killed past these (0 = timeout_seconds + 10 s).
    max_extract_seconds: float = 0.0
    max_extract_mb: int = 1024
    # Zip containers (docx) are refused before parsing when they would expand past these.
    max_unzipped_bytes: int = 100 * 1024 * 1024
    max_zip_ratio: float = 100.0


@dataclass(frozen=True)
class ChecksConfig:
    min_coverage: float = 0.9  # share of indexable files that must be indexed


@dataclass(frozen=True)
class RemoteBatchConfig:
    """Provider batch APIs (file upload, job, poll, results); used by providers/batch support."""

    enabled: bool = False
    wait: bool = True
    concurrency: int = 2
    poll_interval_ms: int = 30_000
    timeout_ms: int = 24 * 3600 * 1000


@dataclass(frozen=True)
class ProviderOverrides:
    """``remote.providers.<name>``: what differs for one provider (0 / empty = the remote.* value)."""

    base_url: str = ""
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    concurrency: int = 0


@dataclass(frozen=True)
class RemoteConfig:
    """Live calls to remote embedding APIs: endpoint, timeouts, concurrency, rate limits, retries.

    ``base_url`` applies to the provider in use (``provider:``, or the one ``auto`` picks);
    ``providers.<name>.base_url`` to one provider whatever is selected (e.g. the fallback).
    Rate limits of 0 mean none; each provider has its own limiter.
    """

    base_url: str = ""
    timeout_ms: int = 60_000  # one indexing request
    query_timeout_ms: int = 15_000  # the query embedding of a search
    concurrency: int = 4  # requests in flight at once, per provider
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_retries: int = 6  # per request, on 429 / 5xx / timeouts / resource exhausted
    backoff_base_ms: int = 500
    backoff_max_ms: int = 60_000
    batch_size: int = 0  # texts per request; 0 = the provider's own maximum
    providers: dict[str, ProviderOverrides] = field(default_factory=dict)
    batch: RemoteBatchConfig = field(default_factory=RemoteBatchConfig)

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


@dataclass(frozen=True)
class ResolvedRemote:
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


@dataclass(frozen=True)
class Settings:
    """Everything the YAML file decides: what to index and how."""

    data_dir: Path
    sources: tuple[SourceConfig, ...]
    provider: str = "auto"
    model: str | None = None
    dims: int | None = None  # output dimensions for models that offer a choice (openai, gemini, voyage)
    fallback: str | None = None  # the provider used when the primary cannot start or fails permanently
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    query: QueryConfig = field(default_factory=QueryConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    multimodal: MultimodalConfig = field(default_factory=MultimodalConfig)
    table_name: str = "memory_vectors"
    ann: AnnConfig = field(default_factory=AnnConfig)
    fts: FtsConfig = field(default_factory=FtsConfig)
    config_path: Path | None = None

    @property
    def assets_dir(self) -> Path:
        return self.data_dir / "assets"

    @property
    def lancedb_uri(self) -> str:
        return str(self.data_dir / "lancedb")

    @property
    def cache_path(self) -> Path:
        return self.data_dir / "cache" / "embeddings.sqlite"

    @property
    def dagster_home(self) -> Path:
        return self.data_dir / "dagster"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def source(self, name: str) -> SourceConfig:
        for src in self.sources:
            if src.name == name:
                return src
        raise ConfigError(f"unknown source {_shown(name)}", key="sources")


# --- loading -----------------------------------------------------------------------------


def resolve_config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: explicit path, then the env var, then ./memory_pipeline.yaml."""
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


def _read_config(cfg_path: Path) -> str:
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


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read and validate the YAML file; raises ConfigError with the key at fault."""
    cfg_path = resolve_config_path(path)
    if not cfg_path.is_file():
        raise ConfigError(
            f"config file not found: {cfg_path}",
            path=str(cfg_path),
            hint=f"pass --config FILE or set {CONFIG_ENV_VAR}",
        )
    text = _read_config(cfg_path)
    try:
        raw = yaml.load(text, Loader=_NoAliasLoader) or {}  # a SafeLoader: builds no arbitrary objects
    except _AliasRefused as err:
        mark = err.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{cfg_path}: the config may not use YAML anchors/aliases{where}", path=str(cfg_path)) from err
    except RecursionError as err:
        raise ConfigError(f"{cfg_path}: not valid YAML: nested too deeply", path=str(cfg_path)) from err
    except yaml.YAMLError as err:
        # Only the position and the problem: the offending line may hold a secret.
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise ConfigError(f"{cfg_path}: not valid YAML{where}: {problem}", path=str(cfg_path)) from err
    return settings_from_dict(raw, base_dir=cfg_path.parent, config_path=cfg_path)


def settings_from_dict(raw: Any, *, base_dir: Path, config_path: Path | None = None) -> Settings:
    """Validate a parsed YAML mapping into Settings."""
    where = str(config_path or "<config>")
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the top level must be a mapping", path=where)
    _refuse_secrets(raw, where)
    _check_keys(
        raw,
        {
            "data_dir", "sources", "provider", "model", "dims", "fallback", "remote",
            "chunking", "cache", "query", "limits", "checks", "multimodal", "table_name", "ann", "fts",
        },  # fmt: skip
        "",
        where,
    )

    data_dir = _path(raw.get("data_dir", "data/index"), base_dir, "data_dir", where)

    sources_raw = raw.get("sources")
    if not isinstance(sources_raw, list) or not sources_raw:
        raise ConfigError(f"{where}: 'sources' must be a non-empty list of {{name, path}}", key="sources", path=where)
    sources: list[SourceConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(sources_raw):
        key = f"sources[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: {key} must be a mapping with name and path", key=key, path=where)
        _check_keys(item, {"name", "path", "include", "exclude"}, key + ".", where)
        name = item.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
            raise ConfigError(f"{where}: {key}.name must be a word (letters, digits, _ . -)", key=key + ".name", path=where)
        if name in seen:
            raise ConfigError(f"{where}: source name {_shown(name)} is used twice", key=key + ".name", path=where)
        seen.add(name)
        if "path" not in item:
            raise ConfigError(f"{where}: {key}.path is required", key=key + ".path", path=where)
        sources.append(
            SourceConfig(
                name=name,
                path=_path(item["path"], base_dir, key + ".path", where),
                include=_globs(item.get("include", list(DEFAULT_INCLUDE)), key + ".include", where),
                exclude=_globs(item.get("exclude", list(DEFAULT_EXCLUDE)), key + ".exclude", where),
            )
        )

    provider = raw.get("provider", "auto")
    if provider not in KNOWN_PROVIDERS:
        raise ConfigError(
            f"{where}: provider must be one of {', '.join(KNOWN_PROVIDERS)}, got {_shown(provider)}", key="provider", path=where
        )
    multimodal = _multimodal(raw, where)
    if multimodal.native and multimodal.enabled:
        _check_native(provider, raw.get("model"))
    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError(f"{where}: model must be a string", key="model", path=where)
    dims = raw.get("dims")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= 16384):
        raise ConfigError(f"{where}: dims must be a positive integer (or left out)", key="dims", path=where)
    fallback = raw.get("fallback")
    if fallback is not None and fallback not in KNOWN_PROVIDERS[1:-1]:
        raise ConfigError(
            f"{where}: fallback must be one of {', '.join(KNOWN_PROVIDERS[1:-1])}, got {_shown(fallback)}", key="fallback", path=where
        )
    if fallback is not None and fallback == provider:
        raise ConfigError(f"{where}: fallback is the same provider as provider ({provider})", key="fallback", path=where)
    remote = _remote(raw.get("remote"), where)

    chunking = _section(raw, "chunking", ChunkingConfig, where)
    if chunking.tokens < 32 or chunking.tokens > 8192:
        raise ConfigError(f"{where}: chunking.tokens must be between 32 and 8192", key="chunking.tokens", path=where)
    if chunking.overlap < 0 or chunking.overlap >= chunking.tokens:
        raise ConfigError(
            f"{where}: chunking.overlap must be >= 0 and smaller than chunking.tokens", key="chunking.overlap", path=where
        )
    cache = _section(raw, "cache", CacheConfig, where)
    if remote.batch.enabled and not cache.enabled:
        # Batch results wait in the cache until every file that needs them is written (and a resumed run finds them there).
        raise ConfigError(f"{where}: remote.batch.enabled needs cache.enabled: true", key="remote.batch.enabled", path=where)
    if cache.max_entries < 1:
        raise ConfigError(f"{where}: cache.max_entries must be >= 1", key="cache.max_entries", path=where)
    query = _section(raw, "query", QueryConfig, where)
    if query.max_results < 1:
        raise ConfigError(f"{where}: query.max_results must be >= 1", key="query.max_results", path=where)
    if not 0.0 <= query.min_score <= 1.0:
        raise ConfigError(f"{where}: query.min_score must be between 0 and 1", key="query.min_score", path=where)
    _check_query(query, where)
    ann = _section(raw, "ann", AnnConfig, where)
    if ann.min_rows < 256 or ann.index_type not in ANN_INDEX_TYPES or ann.nprobes < 1 or ann.refine_factor < 0:
        raise ConfigError(
            f"{where}: ann needs min_rows >= 256, index_type one of {', '.join(ANN_INDEX_TYPES)}, nprobes >= 1, refine_factor >= 0",
            key="ann",
            path=where,
        )
    fts = _section(raw, "fts", FtsConfig, where)
    limits = _section(raw, "limits", LimitsConfig, where)
    for key in ("max_file_bytes", "max_segments_per_file", "max_chars_per_file"):
        if getattr(limits, key) < 1:
            raise ConfigError(f"{where}: limits.{key} must be >= 1", key=f"limits.{key}", path=where)
    checks = _section(raw, "checks", ChecksConfig, where)
    if not 0.0 <= checks.min_coverage <= 1.0:
        raise ConfigError(f"{where}: checks.min_coverage must be between 0 and 1", key="checks.min_coverage", path=where)
    table_name = raw.get("table_name", "memory_vectors")
    if not isinstance(table_name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", table_name):
        raise ConfigError(f"{where}: table_name must be letters, digits and _", key="table_name", path=where)

    return Settings(
        data_dir=data_dir,
        sources=tuple(sources),
        provider=provider,
        model=model,
        dims=dims,
        fallback=fallback,
        remote=remote,
        chunking=chunking,
        cache=cache,
        query=query,
        limits=limits,
        checks=checks,
        multimodal=multimodal,
        table_name=table_name,
        ann=ann,
        fts=fts,
        config_path=config_path,
    )


def _multimodal(raw: dict, where: str) -> MultimodalConfig:
    section = dict(raw.get("multimodal") or {}) if isinstance(raw.get("multimodal", {}), dict) else None
    if section is None:
        raise ConfigError(f"{where}: 'multimodal' must be a mapping", key="multimodal", path=where)
    types = section.pop("types", list(MEDIA_TYPES))
    if isinstance(types, str):
        types = [types]
    if not isinstance(types, list) or any(t not in MEDIA_TYPES for t in types):
        raise ConfigError(
            f"{where}: multimodal.types must be a list of {', '.join(MEDIA_TYPES)}, got {_shown(types)}", key="multimodal.types", path=where
        )
    cfg = _section({"multimodal": section}, "multimodal", MultimodalConfig, where)
    cfg = MultimodalConfig(**{**cfg.__dict__, "types": tuple(dict.fromkeys(types))})
    for key in ("max_file_bytes", "pdf_max_pages", "max_image_pixels", "max_extract_mb", "max_unzipped_bytes"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{where}: multimodal.{key} must be >= 1", key=f"multimodal.{key}", path=where)
    if cfg.max_extract_seconds < 0:
        raise ConfigError(f"{where}: multimodal.max_extract_seconds must be >= 0", key="multimodal.max_extract_seconds", path=where)
    for key in ("keyframe_seconds", "timeout_seconds", "max_zip_ratio"):
        if not getattr(cfg, key) > 0:
            raise ConfigError(f"{where}: multimodal.{key} must be > 0", key=f"multimodal.{key}", path=where)
    return cfg


def _check_native(provider: Any, model: Any) -> None:
    # Checked before provider availability: the answer is the same whichever providers this build has.
    if provider != "gemini" or model != NATIVE_MODEL:
        current = _shown(provider, quote=False) if provider != "gemini" else f"gemini ({_shown(model, quote=False) if model else 'its default model'})"
        raise ConfigError(
            f"Native multimodal embedding requires {NATIVE_MODEL}. Current provider: {current}",
            key="multimodal.native",
            hint=f"set provider: gemini and model: {NATIVE_MODEL}, or multimodal.native: false (derived text works with every provider)",
        )


def _remote(value: Any, where: str) -> RemoteConfig:
    if value is None:
        return RemoteConfig()
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: 'remote' must be a mapping", key="remote", path=where)
    flat = {k: v for k, v in value.items() if k not in ("providers", "batch") and v is not None}  # null = default
    base = _section({"remote": flat}, "remote", RemoteConfig, where)
    for key in ("timeout_ms", "query_timeout_ms", "concurrency"):
        if getattr(base, key) < 1:
            raise ConfigError(f"{where}: remote.{key} must be >= 1", key=f"remote.{key}", path=where)
    for key in ("requests_per_minute", "tokens_per_minute", "max_retries", "batch_size", "backoff_base_ms", "backoff_max_ms"):
        if getattr(base, key) < 0:
            raise ConfigError(f"{where}: remote.{key} must be >= 0", key=f"remote.{key}", path=where)
    _check_url(base.base_url, "remote.base_url", where)
    providers_raw = value.get("providers") or {}
    if not isinstance(providers_raw, dict):
        raise ConfigError(f"{where}: remote.providers must be a mapping of provider names", key="remote.providers", path=where)
    providers = {}
    for name, item in providers_raw.items():
        if name not in REMOTE_PROVIDERS:
            raise ConfigError(
                f"{where}: remote.providers.{name}: not a remote provider ({', '.join(REMOTE_PROVIDERS)})",
                key=f"remote.providers.{name}",
                path=where,
            )
        o = _section({f"remote.providers.{name}": item}, f"remote.providers.{name}", ProviderOverrides, where)
        _check_url(o.base_url, f"remote.providers.{name}.base_url", where)
        providers[name] = o
    batch = _section({"remote.batch": value.get("batch") or {}}, "remote.batch", RemoteBatchConfig, where)
    for key in ("concurrency", "poll_interval_ms", "timeout_ms"):
        if getattr(batch, key) < 1:
            raise ConfigError(f"{where}: remote.batch.{key} must be >= 1", key=f"remote.batch.{key}", path=where)
    return replace(base, providers=providers, batch=batch)


def _check_url(url: str, key: str, where: str) -> None:
    if url and not re.match(r"^https?://[^\s/]+", url):
        raise ConfigError(f"{where}: {key} must be an http(s) URL, got {_shown(url)}", key=key, path=where)
    if url and re.match(r"^https?://[^/]*@", url):
        raise ConfigError(f"{where}: {key} must not carry credentials; use the provider's environment variable", key=key, path=where)
def _check_query(query: QueryConfig, where: str) -> None:
    if query.fusion not in FUSIONS:
        raise ConfigError(f"{where}: query.fusion must be one of {', '.join(FUSIONS)}, got {_shown(query.fusion)}", key="query.fusion", path=where)
    if query.vector_weight < 0 or query.text_weight < 0 or query.vector_weight + query.text_weight == 0:
        raise ConfigError(f"{where}: query.vector_weight and query.text_weight must be >= 0, not both 0", key="query.vector_weight", path=where)
    if query.rrf_k < 1:
        raise ConfigError(f"{where}: query.rrf_k must be >= 1", key="query.rrf_k", path=where)
    if query.candidate_multiplier < 1:
        raise ConfigError(f"{where}: query.candidate_multiplier must be >= 1", key="query.candidate_multiplier", path=where)
    if not 0.0 <= query.mmr_lambda <= 1.0:
        raise ConfigError(f"{where}: query.mmr_lambda must be between 0 and 1", key="query.mmr_lambda", path=where)
    if query.recency_half_life_days < 0:
        raise ConfigError(f"{where}: query.recency_half_life_days must be >= 0 (0 = off)", key="query.recency_half_life_days", path=where)


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
    text = repr(value) if quote else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_keys(mapping: dict, allowed: set[str], prefix: str, where: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown setting '{prefix}{key}' (allowed: {', '.join(sorted(allowed))})",
                key=f"{prefix}{key}",
                path=where,
            )


def _section(raw: dict, name: str, cls: type, where: str):
    value = raw.get(name, {}) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: '{name}' must be a mapping", key=name, path=where)
    defaults = cls()
    allowed = set(defaults.__dataclass_fields__)
    _check_keys(value, allowed, name + ".", where)
    kwargs = {}
    for key, val in value.items():
        expected = type(getattr(defaults, key))
        if expected is float and isinstance(val, int) and not isinstance(val, bool):
            val = float(val)
        if not isinstance(val, expected) or (expected is int and isinstance(val, bool)):
            raise ConfigError(
                f"{where}: {name}.{key} must be {expected.__name__}, got {_shown(val)}", key=f"{name}.{key}", path=where
            )
        kwargs[key] = val
    return cls(**kwargs)


def _path(value: Any, base_dir: Path, key: str, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key} must be a path string", key=key, path=where)
    path = Path(os.path.expandvars(value)).expanduser()
    return (path if path.is_absolute() else base_dir / path).resolve()


def _globs(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key} must be a list of glob strings", key=key, path=where)
    return tuple(value)
