"""Writing and reading files under a source folder on behalf of a remote caller.

A path that arrives over HTTP or MCP is hostile until proven otherwise: it is split into
components, each checked (no ``..``, no hidden or empty names, no separators or NULs), and the
folders are walked one descriptor at a time with ``O_NOFOLLOW``, so neither a crafted name nor a
link planted in the folder can make a write or a read land outside the source folder. Reads of
existing files go through ``memory_pipeline.safeio`` (links inside the folder are followed, links
out are refused), the same opener the indexer uses.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import unicodedata
from pathlib import Path

from memory_pipeline.errors import ConfigError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_NAME = 120
MAX_NAME_BYTES = 255  # NAME_MAX of Linux and macOS file systems
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|]+")


def safe_name(filename: str | None, fallback: str = "upload") -> str:
    """A file name that stays in its folder: the last component of ``filename``, cleaned.

    Folders in the name (``../../x``, ``C:\\x``), control characters, leading dots (hidden
    files, ``..``) and characters shells or other systems trip on are removed.
    """
    name = unicodedata.normalize("NFC", (filename or "").replace("\\", "/").rsplit("/", 1)[-1])
    name = _UNSAFE.sub("_", name).strip(" ._")
    if len(name) > MAX_NAME:
        stem, dot, ext = name.rpartition(".")
        name = (stem[: MAX_NAME - len(ext) - 1] + "." + ext) if dot and len(ext) <= 10 else name[:MAX_NAME]
    return name or fallback


def rel_parts(rel: str, *, field: str) -> list[str]:
    """The components of a path relative to a source folder; ``ConfigError`` naming ``field`` when unsafe."""
    if not isinstance(rel, str) or not rel.strip():
        raise ConfigError(f"{field} must be a relative path inside a source folder", key=field)
    if "\x00" in rel or "\\" in rel:
        raise ConfigError(f"{field} holds a NUL or a backslash: {rel!r}", key=field)
    if rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        raise ConfigError(f"{field} must be relative to the source folder, got {rel!r}", key=field)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts:
        raise ConfigError(f"{field} names no file: {rel!r}", key=field)
    for p in parts:
        if p == ".." or p.startswith(".") or _UNSAFE.search(p.replace(":", "")):
            raise ConfigError(f"{field} may not hold '..', hidden or unsafe names: {rel!r}", key=field)
        # File systems count a name's bytes, not its characters: 200 x 'é' is 400 bytes (ENAMETOOLONG).
        if len(p.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
            raise ConfigError(f"{field} holds a name over {MAX_NAME_BYTES} bytes (UTF-8): {p[:40]!r}…", key=field)
    return parts


def _open_dir(root: Path, parts: list[str], *, create: bool) -> int:
    """A descriptor of ``root/parts…``, walked without following links; folders made when ``create``."""
    fd = os.open(os.path.realpath(root), _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_head(root: Path, parts: list[str], size: int) -> tuple[int, bytes]:
    """``(size, first size bytes)`` of the file at ``root/parts…``, walked without following
    links; ``(0, b"")`` when there is no such file (or folder on the way)."""
    try:
        fd = _open_dir(root, parts[:-1], create=False)
    except (FileNotFoundError, NotADirectoryError):
        return 0, b""
    try:
        try:
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
        except FileNotFoundError:
            return 0, b""
        try:
            st = os.fstat(f)
            if not stat_mod.S_ISREG(st.st_mode):
                raise ConfigError(f"{'/'.join(parts)} is not a regular file", key="path")
            return st.st_size, os.pread(f, size, 0)
        finally:
            os.close(f)
    finally:
        os.close(fd)


def write_file(root: Path, parts: list[str], data: bytes, *, append: bool = False, exclusive: bool = False) -> Path:
    """Write ``data`` at ``root/parts…`` (folders created), never through a link; returns the path."""
    fd = _open_dir(root, parts[:-1], create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        flags |= os.O_APPEND if append else (os.O_EXCL if exclusive else os.O_TRUNC)
        out = os.open(parts[-1], flags, 0o644, dir_fd=fd)
        try:
            st = os.fstat(out)
            if not stat_mod.S_ISREG(st.st_mode):
                raise ConfigError(f"{'/'.join(parts)} is not a regular file", key="path")
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]
        finally:
            os.close(out)
    finally:
        os.close(fd)
    return Path(root, *parts)


def remove_tree(root: Path, parts: list[str]) -> bool:
    """Remove the folder ``root/parts…`` and what it holds, never through a link (a link inside is
    removed itself, not followed)."""
    try:
        parent = _open_dir(root, parts[:-1], create=False)
    except FileNotFoundError:
        return False
    try:
        try:
            fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            return False
        try:
            _empty_dir(fd)
        finally:
            os.close(fd)
        os.rmdir(parts[-1], dir_fd=parent)
        return True
    finally:
        os.close(parent)


def _empty_dir(fd: int, depth: int = 0) -> None:
    """Remove everything in the folder open at ``fd``; sub-folders through their own descriptors."""
    if depth > 8:
        raise ConfigError("asset folder nested too deep to remove", key="assetId")
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat_mod.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                _empty_dir(sub, depth + 1)
            finally:
                os.close(sub)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)
