"""Walking the sources, sniffing content types, hashing: pure functions, no Dagster.

A file's kind comes from its bytes (magic numbers, NUL bytes) first and its
extension second, so a PNG renamed ``.md`` is never fed to the markdown parser.
Links are never followed out of a source root: the walk only looks (``lstat``), and
every read (sniffing, hashing) goes through ``safeio.open_file`` with the source
root, which opens the file once, without following a link out of the root, even one
swapped in after the walk looked. Pass the root (``SourceConfig.path``) to every
function that reads; without it, a link at the file itself is refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from memory_pipeline.errors import ExtractionError
from memory_pipeline.globs import glob_match
from memory_pipeline.safeio import OpenedFile, UnsafeFileError, list_folder, open_file
from memory_pipeline.settings import Settings, SourceConfig

NUM_SHARDS = 16
SHARD_KEYS = tuple(f"{i:02x}" for i in range(NUM_SHARDS))
SNIFF_BYTES = 8192

# Text modalities are always extracted; media ones when `multimodal` enables their type.
INDEXED_MODALITIES = ("markdown", "text", "session")
MEDIA_MODALITIES = ("image", "audio", "video", "pdf", "document")
DOCX_MIME = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
NOTE_SUFFIX = ".note.md"  # the user's note about a file lives beside it: `receipt.jpg.note.md`

_MARKDOWN_EXT = {".md", ".markdown", ".mdx"}
_TEXT_EXT = {".txt", ".text", ".log", ".rst", ".org", ".adoc"}
_SESSION_EXT = {".jsonl", ".ndjson"}
_DOCUMENT_EXT = {
    ".html": "text/html",
    ".htm": "text/html",
    ".csv": "text/csv",
    ".json": "application/json",
    ".xml": "application/xml",
}
# Only for files that were not read (empty, too large): typed by name for the reports.
_MEDIA_EXT = {
    ".jpg": ("image/jpeg", "image"), ".jpeg": ("image/jpeg", "image"), ".png": ("image/png", "image"),
    ".gif": ("image/gif", "image"), ".webp": ("image/webp", "image"), ".heic": ("image/heic", "image"),
    ".heif": ("image/heif", "image"), ".mp3": ("audio/mpeg", "audio"), ".wav": ("audio/wav", "audio"),
    ".ogg": ("audio/ogg", "audio"), ".opus": ("audio/opus", "audio"), ".m4a": ("audio/mp4", "audio"),
    ".aac": ("audio/aac", "audio"), ".flac": ("audio/flac", "audio"), ".mp4": ("video/mp4", "video"),
    ".webm": ("video/webm", "video"), ".mov": ("video/quicktime", "video"), ".pdf": ("application/pdf", "pdf"),
    ".docx": (DOCX_MIME, "document"),
}  # fmt: skip

# (offset, magic bytes, mime, modality)
_MAGIC: tuple[tuple[int, bytes, str, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "image/png", "image"),
    (0, b"\xff\xd8\xff", "image/jpeg", "image"),
    (0, b"GIF87a", "image/gif", "image"),
    (0, b"GIF89a", "image/gif", "image"),
    (0, b"%PDF-", "application/pdf", "pdf"),
    (0, b"PK\x03\x04", "application/zip", "document"),
    (0, b"fLaC", "audio/flac", "audio"),
    (0, b"\x7fELF", "application/x-executable", "binary"),
    (0, b"\x1f\x8b", "application/gzip", "binary"),
    (0, b"SQLite format 3\x00", "application/vnd.sqlite3", "binary"),
)


@dataclass(frozen=True)
class DiscoveredFile:
    """One file found under a source, before hashing."""

    source: str
    path: str  # relative to the source root, POSIX separators
    abs_path: str
    shard: str
    size: int
    mtime_ns: int
    inode: int
    status: str  # "ok" | "skipped" | "failed"
    reason: str = ""
    # The path is shown in place of the file's own name (escaped: not UTF-8; or redacted: it holds a
    # secret), and is no name of its folder now (:func:`_distinct_name`). Rows at that path are of a
    # file that is gone: they are not kept as a failed file's last good rows are.
    shown: bool = False
    # A folder (``path`` ends in ``/``; ``./`` for the source's root) that could not be listed this
    # time (permissions, a disk error), or an entry that could not be stat'ed (it may be a folder):
    # the rows of the files under it are kept, as a missing source's are, until it can be read again.
    unlisted: bool = False

    @property
    def doc_id(self) -> str:
        return doc_id(self.source, self.path)


def doc_id(source: str, path: str) -> str:
    """The stable key of a file across the pipeline: ``source:relative/path``."""
    return f"{source}:{path}"


def shard_of(source: str, rel_path: str) -> str:
    """The partition a file belongs to forever: a stable hash of (source, path)."""
    digest = hashlib.blake2b(f"{source}\0{rel_path}".encode(), digest_size=8).digest()
    return SHARD_KEYS[int.from_bytes(digest, "big") % NUM_SHARDS]


def is_selected(rel_path: str, source: SourceConfig) -> bool:
    if not any(glob_match(rel_path, p) for p in source.include):
        return False
    return not any(glob_match(rel_path, p) for p in source.exclude)


def walk_source(source: SourceConfig, max_file_bytes: int, own: frozenset[str] = frozenset()) -> Iterator[DiscoveredFile]:
    """Stat-walk one source root; yields every selected file, with a status.

    Only ``lstat`` is used, so a walk of 10k unchanged files costs milliseconds. Folders
    are listed through descriptors opened without following links (``safeio.list_folder``).
    ``own``: real paths of folders that are never walked (the data folder, when it lies inside
    the source: its Parquet files, table and run records are not the user's memory).
    """
    root = source.path
    if not root.is_dir():
        return
    root_real = os.path.realpath(root)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        current = os.path.join(root, rel_dir) if rel_dir else str(root)
        try:
            entries = sorted(list_folder(root, rel_dir), key=lambda e: e[0])
        except OSError as err:
            why = err.strerror or str(err)
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                why = "it was replaced by a link or a file while walking; not followed"
            yield _bad(source, (rel_dir or ".") + "/", current, "failed", f"cannot list folder: {why}", unlisted=True)
            continue
        # A name shown in place of the real one (escaped, or redacted) is never another file's: the
        # folder's names (one that is not UTF-8 holds a surrogate, which no shown name does), and
        # each shown name as it is given out.
        taken = {name for name, _ in entries}
        for name, st in entries:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            abs_path = os.path.join(current, name)
            if not _utf8(name):
                # Bytes that are not UTF-8 (a Latin-1 name copied from an old disk): no record,
                # id, Parquet file or table can hold the name, so it is reported, shown escaped.
                folder = not isinstance(st, OSError) and stat_mod.S_ISDIR(st.st_mode)
                wanted = not _pruned(rel, source) if folder else is_selected(rel, source)
                if wanted:
                    kind = "folder" if folder else "file"
                    reason = f"the {kind} name is not valid UTF-8; not indexed (rename the {kind} to index {'what it holds' if folder else 'it'})"
                    shown = _distinct_name(escaped_name(name), taken)
                    shown_rel = (f"{rel_dir}/{shown}" if rel_dir else shown) + ("/" if folder else "")
                    named = _secret_in_name(shown_rel)  # a secret in it is not stored, escaped or not
                    if named:
                        shown_rel, reason = _distinct_rel(named[0], taken, shown), named[1]
                    yield _shown(source, root, shown_rel, reason)
                continue
            if isinstance(st, OSError):
                # Not walked if it is a folder (a folder readable but not searchable, a disk error):
                # what was indexed under it is kept, as under a folder that cannot be listed.
                yield _bad(source, rel, abs_path, "failed", f"cannot stat: {st.strerror or st}", unlisted=True)
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                if _pruned(rel, source) or (own and os.path.join(root_real, rel) in own):
                    continue
                named = _secret_in_name(rel)
                if named is None:
                    stack.append(rel)
                elif _selects_any(root, rel, source):
                    # Reported once, redacted, and not walked: every path under it holds the secret
                    # too. Its files were each reported under the redacted folder, which could be
                    # another folder's real name (``[REDACTED:aws-access-key]/a.md``) or two secret
                    # folders' alike.
                    yield _shown(source, root, _distinct_rel(named[0] + "/", taken, name), _SECRET_FOLDER)
                continue
            if not is_selected(rel, source):
                continue
            named = _secret_in_name(rel)
            if named:
                # Never stored, not even as a path in the records: the name is shown redacted.
                yield _shown(source, root, _distinct_rel(named[0], taken, name), named[1])
                continue
            if stat_mod.S_ISLNK(st.st_mode):
                try:
                    target = os.path.realpath(abs_path)
                except OSError as err:  # the link was removed between lstat and readlink
                    yield _bad(source, rel, abs_path, "skipped", f"broken symlink: {err.strerror or err}")
                    continue
                if not (target == root_real or target.startswith(root_real + os.sep)):
                    yield _bad(source, rel, abs_path, "skipped", f"symlink points outside the source root ({target}); not followed")
                    continue
                try:
                    st = os.stat(target)
                except OSError as err:
                    yield _bad(source, rel, abs_path, "skipped", f"broken symlink: {err.strerror or err}")
                    continue
                if not stat_mod.S_ISREG(st.st_mode):
                    yield _bad(source, rel, abs_path, "skipped", "symlink to something that is not a regular file")
                    continue
            elif not stat_mod.S_ISREG(st.st_mode):
                yield _bad(source, rel, abs_path, "skipped", "not a regular file (fifo, socket or device)")
                continue
            status, reason = "ok", ""
            if st.st_size == 0:
                status, reason = "skipped", "empty file (0 bytes): nothing to index"
            elif st.st_size > max_file_bytes:
                status, reason = "skipped", f"file is {st.st_size} bytes, over limits.max_file_bytes={max_file_bytes}"
            yield DiscoveredFile(
                source=source.name,
                path=rel,
                abs_path=abs_path,
                shard=shard_of(source.name, rel),
                size=st.st_size,
                mtime_ns=st.st_mtime_ns,
                inode=st.st_ino,
                status=status,
                reason=reason,
            )


def _utf8(name: str) -> bool:
    """Whether a name read from the file system is text (Python decodes bytes that are not UTF-8
    as lone surrogates, which nothing downstream can store)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped_name(name: str) -> str:
    """A file system name as text that can be stored and shown: bytes that are not UTF-8 as
    ``\\xNN`` (``caf\\xe9.md``)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _pruned(rel_dir: str, source: SourceConfig) -> bool:
    """Whether an exclude glob covers everything under the folder ``rel_dir`` (then it is not walked)."""
    return any(glob_match(rel_dir + "/", p) for p in source.exclude)


def _selects_any(root: str | os.PathLike[str], rel_dir: str, source: SourceConfig) -> bool:
    """Whether the folder ``rel_dir`` holds a file that ``source`` selects (nothing is recorded)."""
    stack = [rel_dir]
    while stack:
        current = stack.pop()
        try:
            entries = list_folder(root, current)
        except OSError:
            continue
        for name, st in entries:
            rel = f"{current}/{name}"
            if isinstance(st, OSError):
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                if not _pruned(rel, source):
                    stack.append(rel)
            elif is_selected(rel, source):
                return True
    return False


_SECRET_FOLDER = "the folder name holds what looks like a secret; not indexed (rename the folder to index what it holds)"


def _distinct_name(shown: str, taken: set[str]) -> str:
    """``shown``, or ``shown~2``, ``shown~3``…: the first that no name in ``taken`` is, which is
    then taken. An escaped name (``caf\\xe9.md`` for the Latin-1 ``caf<E9>.md``) or a redacted one
    can be another file's real name in the same folder; sharing its record path, the reported file's
    record replaced the indexed one's, which every run then wrote again and counted as not indexed."""
    candidate, n = shown, 1
    while candidate in taken:
        n += 1
        candidate = f"{shown}~{n}"
    taken.add(candidate)
    return candidate


def _distinct_rel(shown_rel: str, taken: set[str], own: str) -> str:
    """A redacted path shown for a name ``own`` of a folder, its last part made distinct among the
    folder's names (``taken``) when the redaction changed it. A last part left as ``own`` is the
    name's own, already unique: only a secret that runs across the folder's path and the name leaves
    it (a folder whose own name holds one is not walked). A folder's path keeps its ``/``."""
    slash = "/" if shown_rel.endswith("/") else ""
    head, _, last = shown_rel.rstrip("/").rpartition("/")
    if last != own:
        last = _distinct_name(last, taken)
    return (f"{head}/{last}" if head else last) + slash


@lru_cache(maxsize=65536)  # a path is checked once per process, not on every walk (up to 65,536 paths)
def _secret_in_name(rel: str) -> tuple[str, str] | None:
    """(redacted path, reason) when a file or folder name holds what looks like a secret."""
    from memory_pipeline.extraction.redact import redact  # imported on use: redact's detectors are heavy

    clean, found = redact(rel)
    if not found:
        return None
    return clean, "the file name holds what looks like a secret; not indexed (rename the file to index it)"


_keep_name_checks = False


def keep_name_checks() -> None:
    """This process walks the folders again and again and keeps the names it checked
    (:func:`forget_name_checks` then does nothing): ``memory serve``'s server and its index worker,
    whose every run would otherwise check each name again (about 20 us a path: 1.3 s of CPU per
    run at 65,536 files)."""
    global _keep_name_checks
    _keep_name_checks = True


def forget_name_checks() -> None:
    """Let go of the names checked so far (:func:`_secret_in_name`'s cache) in a process that runs
    once (``memory index``, a Dagster run's worker): its stages after the walk need none of them.
    At 65,536 paths the cache holds about 11 MB of Python objects (tracemalloc), and it was held
    through the whole write stage of a 100,000-note run (at its first fold: two blocks per path,
    10,000 of each at 10,000 notes; 2026-12-06). The sensor's walks do not call this; a server
    keeps its names (:func:`keep_name_checks`)."""
    if not _keep_name_checks:
        _secret_in_name.cache_clear()


def missing_sources(settings: Settings) -> list[tuple[SourceConfig, str]]:
    """The sources whose folder is not there (an unmounted disk, a typo), each with why: ``not
    found`` or ``is not a folder``. The walk yields nothing for them; the rows indexed from them are
    kept (``stages.discover``), and ``scan`` and ``doctor`` say so."""
    return [(s, "is not a folder" if s.path.exists() else "not found") for s in settings.sources if not s.path.is_dir()]


def walk_all(settings: Settings) -> Iterator[DiscoveredFile]:
    own = own_folders(settings)
    for source in settings.sources:
        yield from walk_source(source, settings.limits.max_file_bytes, own)


def own_folders(settings: Settings) -> frozenset[str]:
    """Real paths of the folders this configuration writes, which a walk never enters: its data
    folder, or ``local_dir`` with an ``s3://`` data_dir (all it writes on this machine is under it).
    A data folder inside a source (``path: .`` beside ``data_dir: data/index``) had its Parquet
    assets, run records and table indexed as notes, and every run found its own writes changed."""
    from memory_pipeline import storage

    return frozenset({os.path.realpath(storage.of(settings).root)})


def _shown(source: SourceConfig, root: str | os.PathLike[str], shown_rel: str, reason: str) -> DiscoveredFile:
    """The failed record of a name shown in place of its own (escaped or redacted): see ``DiscoveredFile.shown``."""
    return _bad(source, shown_rel, os.path.join(root, shown_rel), "failed", reason, shown=True)


def _bad(source: SourceConfig, rel: str, abs_path: str, status: str, reason: str, *, shown: bool = False, unlisted: bool = False) -> DiscoveredFile:
    return DiscoveredFile(
        source=source.name,
        path=rel,
        abs_path=abs_path,
        shard=shard_of(source.name, rel),
        size=0,
        mtime_ns=0,
        inode=0,
        status=status,
        reason=reason,
        shown=shown,
        unlisted=unlisted,
    )


def sniff(head: bytes, rel_path: str) -> tuple[str, str]:
    """(mime type, modality) from the first bytes of a file, then its extension."""
    for offset, magic, mime, modality in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return mime, modality
    if head[:4] == b"OggS":
        if b"OpusHead" in head[:256]:
            return "audio/opus", "audio"
        if b"\x80theora" in head[:256]:
            return "video/ogg", "video"
        return "audio/ogg", "audio"
    if head[:4] == b"\x1aE\xdf\xa3":
        return ("video/x-matroska", "video") if b"matroska" in head[:64] else ("video/webm", "video")
    if head[:3] == b"ID3" and len(head) >= 5 and head[3] in (2, 3, 4) and head[4] < 0xFF:
        return "audio/mpeg", "audio"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx"):
            return "image/heic", "image"
        if brand in (b"mif1", b"msf1", b"heif"):
            return "image/heif", "image"
        if brand in (b"avif", b"avis"):
            return "image/avif", "image"
        if brand in (b"M4A ", b"M4B "):
            return "audio/mp4", "audio"
        if brand == b"qt  ":
            return "video/quicktime", "video"
        return "video/mp4", "video"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "audio/wav", "audio"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp", "image"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "video/x-msvideo", "video"
    if len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xF6) == 0xF0:
        return "audio/aac", "audio"  # ADTS frame sync
    if len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0 and rel_path.lower().endswith((".mp3", ".mp2", ".aac")):
        return "audio/mpeg", "audio"
    if b"\x00" in head:
        return "application/octet-stream", "binary"
    ext = os.path.splitext(rel_path)[1].lower()
    if not head and ext in _MEDIA_EXT:
        return _MEDIA_EXT[ext]
    if ext not in _MARKDOWN_EXT | _TEXT_EXT | _SESSION_EXT:
        start = head.lstrip()[:64].lower()
        if start.startswith((b"<!doctype html", b"<html")):
            return "text/html", "document"
        if start.startswith(b"<?xml"):
            return "application/xml", "document"
    if ext in _MARKDOWN_EXT:
        return "text/markdown", "markdown"
    if ext in _SESSION_EXT:
        return "application/x-ndjson", "session"
    if ext in _DOCUMENT_EXT:
        return _DOCUMENT_EXT[ext], "document"
    return "text/plain", "text"


def sniff_file(abs_path: str, rel_path: str, root: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(mime type, modality) of a file opened contained in ``root`` (``safeio.open_file``)."""
    with open_file(abs_path, root) as f:
        return _sniff_opened(f, rel_path)


def _sniff_opened(f: OpenedFile, rel_path: str) -> tuple[str, str]:
    mime, modality = sniff(f.pread(SNIFF_BYTES), rel_path)
    if mime == "application/zip":
        mime, modality = _sniff_zip(f)
    return mime, modality


def _sniff_zip(f: OpenedFile) -> tuple[str, str]:
    """A zip is a Word document when it holds word/document.xml; any other zip is an archive.

    Only the central directory is read here; nothing is inflated.
    """
    import zipfile

    try:
        with f.stream() as fh, zipfile.ZipFile(fh) as zf:
            names = set(zf.namelist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        return "application/zip", "binary"
    if "word/document.xml" in names:
        return DOCX_MIME, "document"
    return "application/zip", "binary"


def sha256_file(abs_path: str, root: str | os.PathLike[str] | None = None, *, chunk_size: int = 1 << 20) -> str:
    """Streaming SHA-256 of a file opened contained in ``root``; a large file never sits in memory."""
    with open_file(abs_path, root) as f:
        return _sha256_opened(f, chunk_size)


def _sha256_opened(f: OpenedFile, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    offset = 0
    while block := os.pread(f.fd, chunk_size, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


@dataclass(frozen=True)
class FileFacts:
    """What one open of a file tells: its type, its hash, and the stat of what was hashed."""

    mime: str
    modality: str
    sha256: str
    size: int
    mtime_ns: int
    inode: int


def inspect_file(abs_path: str, rel_path: str, root: str | os.PathLike[str] | None = None) -> FileFacts:
    """Sniff and hash one file through a single contained open, so both describe the same file.

    Raises ``safeio.UnsafeFileError`` (an ``ExtractionError``) for a file refused before
    reading (a link out of the source folder, a FIFO) and ``OSError`` when it cannot be read.
    """
    with open_file(abs_path, root) as f:
        mime, modality = _sniff_opened(f, rel_path)
        digest = _sha256_opened(f)
        st = f.stat
        return FileFacts(mime, modality, digest, st.st_size, st.st_mtime_ns, st.st_ino)


def classify(mime: str, modality: str, rel_path: str, media_types: tuple[str, ...] = ()) -> tuple[str, str]:
    """(status, reason) for a sniffed file: indexed, or skipped with why.

    ``media_types``: the media modalities the config indexes (``multimodal.types``).
    """
    if modality in INDEXED_MODALITIES:
        return "ok", ""
    ext = os.path.splitext(rel_path)[1].lower()
    if ext in _MARKDOWN_EXT | _TEXT_EXT | _SESSION_EXT:
        return "failed", f"content is {mime} ({modality}), not the text its {ext} name claims"
    if modality == "binary":
        return "skipped", f"binary content ({mime}); not indexable"
    if modality in media_types:
        return "ok", ""
    return "skipped", f"{modality} files ({mime}) are not indexed (multimodal.enabled / multimodal.types)"


def indexed_media_types(settings: Settings) -> tuple[str, ...]:
    mm = settings.multimodal
    return mm.types if mm.enabled else ()


def media_size_problem(settings: Settings, modality: str, size: int) -> str:
    """Why a media file is too large to index ('' when it is not)."""
    return media_size_problem_of(modality, size, settings.multimodal.max_file_bytes)


def media_size_problem_of(modality: str, size: int, limit: int) -> str:
    """:func:`media_size_problem` for a limit of ``limit`` bytes."""
    if modality in MEDIA_MODALITIES and size > limit:
        return f"file is {size} bytes, over multimodal.max_file_bytes={limit}"
    return ""


def utf8_problem(abs_path: str, root: str | os.PathLike[str] | None = None, *, chunk_size: int = 1 << 20) -> str:
    """Why a text file is not valid UTF-8 (streamed, bounded memory), or '' when it is."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open_file(abs_path, root) as f:
        while block := os.pread(f.fd, chunk_size, offset):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                pos = offset + err.start
                return f"not valid UTF-8 (byte 0x{block[err.start : err.start + 1].hex()} at offset {pos}); convert the file to UTF-8"
            offset += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return "not valid UTF-8 (truncated multi-byte character at the end)"
    return ""


@dataclass(frozen=True)
class Assessment:
    """What the index makes of one walked file: its type, hash and stat, and whether it is indexed.

    ``status``/``reason`` are the file's outcome (ok, skipped or failed, and why);
    ``walk_status`` is what the stat walk alone said, kept so that a later walk can be
    compared with this one without re-deriving it from the reason text.
    """

    mime: str
    modality: str
    sha256: str  # the file's SHA-256 plus the note tag of a media file; '' when not read
    size: int
    mtime_ns: int
    inode: int
    status: str
    reason: str
    walk_status: str


def _note_tag(abs_path: str, root: str | os.PathLike[str] | None) -> str:
    """A media file's note (``<file>.note.md``) is part of what it is indexed from: its stat
    joins the file's content hash, so editing the note re-indexes the file. A note that is a
    link out of the source folder is no note (extraction refuses it the same way)."""
    try:
        with open_file(abs_path + NOTE_SUFFIX, root) as note:
            st = note.stat
    except (OSError, ExtractionError):
        return ""
    return f"+note:{st.st_size}:{st.st_mtime_ns}"


def assess(
    f: DiscoveredFile,
    settings: Settings,
    *,
    known: tuple[str, str, str] | None = None,
    read_content: bool = True,
) -> Assessment:
    """Classify one walked file: the one classifier behind `memory index` and `memory scan`.

    ``known``: (sha256, mime, modality) from the last manifest when the stat is unchanged;
    the file is then not read again. ``read_content=False`` (scan) sniffs without hashing.
    Never raises for a file's own problem: unreadable, refused or unsupported files come
    back with their status and reason.
    """
    mime, modality, sha = "", "", ""
    size, mtime_ns, inode = f.size, f.mtime_ns, f.inode
    status, reason = f.status, f.reason
    if f.status != "ok":
        if f.path:  # not read (empty, too large, a link out of the root): typed by its name
            mime, modality = sniff(b"", f.path)
        return Assessment(mime, modality, sha, size, mtime_ns, inode, status, reason, f.status)
    root = settings.source(f.source).path if f.source in {s.name for s in settings.sources} else None
    try:
        if known is not None:
            sha, mime, modality = known
            sha = sha.split("+", 1)[0]
        elif read_content:
            # One contained open: the type, the hash and the stat all describe the same file.
            facts = inspect_file(f.abs_path, f.path, root)
            mime, modality, sha = facts.mime, facts.modality, facts.sha256
            size, mtime_ns, inode = facts.size, facts.mtime_ns, facts.inode
        else:
            mime, modality = sniff_file(f.abs_path, f.path, root)
        status, reason = classify(mime, modality, f.path, indexed_media_types(settings))
        if modality in MEDIA_MODALITIES:
            if sha:
                sha += _note_tag(f.abs_path, root)
            too_big = media_size_problem(settings, modality, f.size)
            if status == "ok" and too_big:
                status, reason = "skipped", too_big
    except UnsafeFileError as err:  # a link out of the folder or a FIFO, seen only when opened
        status, reason = "skipped", err.reason
    except PermissionError:
        status, reason = "failed", "permission denied"
    except OSError as err:
        status, reason = "failed", f"cannot read: {err.strerror or err}"
    except ExtractionError as err:
        status, reason = "failed", err.reason
    return Assessment(mime, modality, sha, size, mtime_ns, inode, status, reason, f.status)
