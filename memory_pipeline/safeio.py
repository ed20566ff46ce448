"""Opening a file under a source folder once, without following links out of it.

The walker looks at a path, but everything after it (sniffing, hashing, extracting,
reading a media file's note) must read the *same* file, and only a file inside the
source folder, even when someone swaps a link between the two moments. So a file is
opened here once, component by component from a descriptor of the source folder with
``O_NOFOLLOW``, and every later reader gets that descriptor: a stream over it
(``OpenedFile.stream``), its bytes (``pread``), or, for a child process that
inherits it, ``/proc/self/fd/N`` (the same open file, never the path again).

Links inside the folder are followed, as the walker allows them: a link is resolved
once, its target checked against the folder's real path, and the target then opened
component by component again with ``O_NOFOLLOW``. If the link flips meanwhile, the
walk meets a link again and checks again; what is finally opened was reached through
real folders under the source folder. Hard links and bind mounts cannot be told apart
from ordinary files and are not refused.

Errors::

    ExtractionError
    └── UnsafeFileError          refused before a byte was read (carries ``path``, ``reason``)
        ├── UnsafeLinkError      a link that leads outside its source folder (or any link without one)
        └── NotRegularFileError  a FIFO, socket, device or folder where a file was expected

Ordinary OS errors (missing file, permission denied) are raised as ``OSError``.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import BinaryIO

from memory_pipeline.errors import ExtractionError

# Enough for any honest chain of links; a link flipping under us forever stops here.
MAX_LINKS = 40
_NOCTTY = getattr(os, "O_NOCTTY", 0)
# O_NONBLOCK: a FIFO swapped in after the lstat opens at once instead of waiting for a writer
# (and is then refused by the fstat); it changes nothing for a regular file.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | _NOCTTY
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OUTSIDE_REASON = "a link that leads outside its source folder"


class UnsafeFileError(ExtractionError):
    """A file was refused before any of it was read."""


class UnsafeLinkError(UnsafeFileError):
    """A link that leads outside its source folder, or a link given without a folder to check it against."""


class NotRegularFileError(UnsafeFileError):
    """Not a regular file: a FIFO, socket, device or folder (reading one could block or have side effects)."""


class OpenedFile:
    """A regular file opened once; every reader reads this descriptor, never the path again."""

    def __init__(self, fd: int, path: str, st: os.stat_result) -> None:
        self.fd = fd
        self.path = path  # for messages only
        self.stat = st

    @property
    def size(self) -> int:
        return self.stat.st_size

    def pread(self, n: int, offset: int = 0) -> bytes:
        """Up to ``n`` bytes from ``offset`` (short only at the end of the file)."""
        parts = []
        while n > 0:
            block = os.pread(self.fd, min(n, 1 << 20), offset)
            if not block:
                break
            parts.append(block)
            n -= len(block)
            offset += len(block)
        return b"".join(parts)

    def stream(self) -> BinaryIO:
        """A binary file object over the descriptor, at offset 0, for libraries that read files.

        It is a duplicate, so it shares the offset with other streams of this file: use one at a time.
        """
        fh = os.fdopen(os.dup(self.fd), "rb", closefd=True)
        fh.seek(0)
        return fh

    def tool_path(self) -> str:
        """A path a child process given this descriptor (``pass_fds``) opens as this very file."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_file(abs_path: str, root: str | os.PathLike[str] | None = None) -> OpenedFile:
    """Open a regular file under ``root`` without following links out of it.

    Without ``root`` (a file named by hand, an old caller) no link is followed at all
    at the last component. Raises ``UnsafeFileError`` for what is refused and
    ``OSError`` when the file cannot be opened.
    """
    if root is None:
        return _open_plain(abs_path)
    root_real = os.path.realpath(root)
    rel = relative_to_root(abs_path, os.fspath(root), root_real)
    root_fd = os.open(root_real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_under(root_fd, root_real, rel, abs_path)
    finally:
        os.close(root_fd)


def relative_to_root(abs_path: str, root: str, root_real: str) -> list[str]:
    """The components of ``abs_path`` below the root as given or as resolved; refused when outside both."""
    path = os.path.abspath(abs_path)
    for base in (os.path.abspath(root), root_real):
        if path.startswith(base.rstrip(os.sep) + os.sep):
            return [p for p in path[len(base.rstrip(os.sep)) + 1 :].split(os.sep) if p]
    raise UnsafeLinkError(abs_path, f"not inside its source folder {root}")


def _open_plain(abs_path: str) -> OpenedFile:
    st = os.lstat(abs_path)
    if stat_mod.S_ISLNK(st.st_mode):
        raise UnsafeLinkError(abs_path, "a link, and no source folder was given to check where it leads; not followed")
    if not stat_mod.S_ISREG(st.st_mode):
        raise NotRegularFileError(abs_path, _not_regular(st))
    try:
        fd = os.open(abs_path, _FILE_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:  # became a link since the lstat
            raise UnsafeLinkError(abs_path, "a link, and no source folder was given to check where it leads; not followed") from err
        raise
    return _checked(fd, abs_path)


def _open_under(root_fd: int, root_real: str, rel: list[str], display: str) -> OpenedFile:
    pending = list(rel)
    done: list[str] = []  # real folders walked so far, from the root
    dir_fd = os.dup(root_fd)
    links = 0
    try:
        while pending:
            name = pending.pop(0)
            if name == ".":
                continue
            if name == "..":
                if not done:
                    raise UnsafeLinkError(display, OUTSIDE_REASON)
                done.pop()
                os.close(dir_fd)
                dir_fd = _reopen(root_fd, done)
                continue
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat_mod.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise _too_many_links(display)
                pending = _link_target(root_real, done, name, display) + pending
                done = []
                os.close(dir_fd)
                dir_fd = os.dup(root_fd)
                continue
            if not pending:
                if not stat_mod.S_ISREG(st.st_mode):
                    raise NotRegularFileError(display, _not_regular(st))
                try:
                    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
                except OSError as err:
                    if err.errno != errno.ELOOP:
                        raise
                    pending = [name]  # swapped for a link since the lstat: look again
                    links += 1
                    if links > MAX_LINKS:
                        raise _too_many_links(display) from err
                    continue
                return _checked(fd, display)
            if not stat_mod.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.path.join(root_real, *done, name))
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as err:
                if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                pending.insert(0, name)  # swapped since the lstat: look again
                links += 1
                if links > MAX_LINKS:
                    raise _too_many_links(display) from err
                continue
            os.close(dir_fd)
            dir_fd = sub
            done.append(name)
        raise NotRegularFileError(display, "a folder, not a file")
    finally:
        os.close(dir_fd)


def _too_many_links(display: str) -> UnsafeLinkError:
    return UnsafeLinkError(display, f"more than {MAX_LINKS} links to follow (a loop, or a link that keeps changing)")


def _link_target(root_real: str, done: list[str], name: str, display: str) -> list[str]:
    """Where a link found at ``done/name`` leads, as components under the root; refused when outside."""
    resolved = os.path.realpath(os.path.join(root_real, *done, name))
    if resolved == root_real:
        return []
    if not resolved.startswith(root_real.rstrip(os.sep) + os.sep):
        raise UnsafeLinkError(display, f"{OUTSIDE_REASON} ({resolved}); not followed")
    return [p for p in resolved[len(root_real.rstrip(os.sep)) + 1 :].split(os.sep) if p]


def _reopen(root_fd: int, parts: list[str]) -> int:
    return _descend(os.dup(root_fd), parts)


def _checked(fd: int, display: str) -> OpenedFile:
    """The descriptor's own stat decides: the path may have been swapped between lstat and open."""
    st = os.fstat(fd)
    if not stat_mod.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFileError(display, _not_regular(st))
    return OpenedFile(fd, display, st)


def _not_regular(st: os.stat_result) -> str:
    mode = st.st_mode
    what = (
        "a folder" if stat_mod.S_ISDIR(mode)
        else "a FIFO" if stat_mod.S_ISFIFO(mode)
        else "a socket" if stat_mod.S_ISSOCK(mode)
        else "a device" if stat_mod.S_ISCHR(mode) or stat_mod.S_ISBLK(mode)
        else "not a regular file"
    )  # fmt: skip
    return f"{what}, not a regular file; not read"


def list_folder(root: str | os.PathLike[str], rel_dir: str) -> list[tuple[str, os.stat_result | OSError]]:
    """The entries of a folder under ``root`` with their ``lstat``, the folder reached without following any link.

    The walker never descends into a link; opening each folder component by component
    with ``O_NOFOLLOW`` keeps a folder swapped for a link mid-walk (to ``/``, say) from
    being listed. A failed ``lstat`` of one entry is given as its ``OSError``.
    """
    root_real = os.path.realpath(root)
    # _descend consumes the root's descriptor, also when it fails: only the folder's is closed here
    # (closing the root's again closed a number another thread may have been given since).
    fd = _descend(os.open(root_real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), [p for p in rel_dir.split("/") if p])
    try:
        out: list[tuple[str, os.stat_result | OSError]] = []
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError as err:
                    out.append((entry.name, err))
        return out
    finally:
        os.close(fd)


def _descend(fd: int, parts: list[str]) -> int:
    """``fd`` walked down ``parts`` with O_NOFOLLOW; the given descriptor is consumed."""
    for part in parts:
        try:
            sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = sub
    return fd
