"""Unit tests for memory_pipeline.discovery: globs, shards, sniffing, classification, walking, hashing."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.discovery import (
    SHARD_KEYS,
    classify,
    glob_match,
    is_selected,
    sha256_file,
    shard_of,
    sniff,
    sniff_file,
    walk_source,
)
from memory_pipeline.settings import DEFAULT_EXCLUDE, DEFAULT_INCLUDE, SourceConfig

GLOBS = [
    ("a.md", "**/*.md", True),
    ("x/y/a.md", "**/*.md", True),
    ("a.md", "*.md", True),
    ("x/a.md", "*.md", False),
    ("a.mdx", "*.md", False),
    ("a.txt", "**/*.md", False),
    (".git", "**/.*", True),
    ("a/.hidden", "**/.*", True),
    ("a/visible", "**/.*", False),
    ("a/.git/config", "**/.*/**", True),
    ("a/node_modules/x/y.js", "**/node_modules/**", True),
    ("node_modules/x.js", "**/node_modules/**", True),
    ("notes/2026-01.md", "notes/????-??.md", True),
    ("notes/2026-1.md", "notes/????-??.md", False),
    ("a+b(1).md", "a+b(1).md", True),
    ("axb.md", "a.b.md", False),
]


@pytest.mark.parametrize(("path", "pattern", "expected"), GLOBS)
def test_glob_match(path, pattern, expected):
    """`**` spans folders, `*` and `?` stay within one, regex metacharacters are literal."""
    assert glob_match(path, pattern) is expected


def test_is_selected_uses_include_then_exclude():
    """A file is selected when some include matches and no exclude does."""
    src = SourceConfig(name="s", path=Path("/x"), include=("**/*.md",), exclude=DEFAULT_EXCLUDE)
    assert is_selected("a/b.md", src)
    assert not is_selected("a/b.txt", src)
    assert not is_selected(".obsidian/b.md", src)


def test_shard_of_stable_and_spread():
    """Shards are deterministic, within SHARD_KEYS, depend on source and path, and spread out."""
    paths = [f"notes/{i}.md" for i in range(400)]
    shards = [shard_of("notes", p) for p in paths]
    assert shards == [shard_of("notes", p) for p in paths]
    assert set(shards) <= set(SHARD_KEYS)
    assert len(set(shards)) == len(SHARD_KEYS)
    assert [shard_of("other", p) for p in paths] != shards


SNIFF = [
    ("png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, "image/png", "image"),
    ("jpeg", b"\xff\xd8\xff\xe0\x00\x10JFIF", "image/jpeg", "image"),
    ("gif87", b"GIF87a\x01\x00", "image/gif", "image"),
    ("gif89", b"GIF89a\x01\x00", "image/gif", "image"),
    ("pdf", b"%PDF-1.7\n%\xe2\xe3", "application/pdf", "pdf"),
    ("zip", b"PK\x03\x04\x14\x00", "application/zip", "document"),
    ("wav", b"RIFF\x24\x08\x00\x00WAVEfmt ", "audio/wav", "audio"),
    ("webp", b"RIFF\x24\x08\x00\x00WEBPVP8 ", "image/webp", "image"),
    ("mp4", b"\x00\x00\x00\x18ftypisom\x00\x00", "video/mp4", "video"),
    ("mov", b"\x00\x00\x00\x14ftypqt  \x00\x00", "video/quicktime", "video"),
    ("m4a", b"\x00\x00\x00\x20ftypM4A \x00\x00", "audio/mp4", "audio"),
    ("heic", b"\x00\x00\x00\x18ftypheic\x00\x00", "image/heic", "image"),
    ("ogg", b"OggS\x00\x02", "audio/ogg", "audio"),
    ("flac", b"fLaC\x00\x00\x00\x22", "audio/flac", "audio"),
    ("webm", b"\x1aE\xdf\xa3\x9fB\x86", "video/webm", "video"),
    ("elf", b"\x7fELF\x02\x01", "application/x-executable", "binary"),
    ("gzip", b"\x1f\x8b\x08\x00", "application/gzip", "binary"),
]


@pytest.mark.parametrize("name", ["notes/x.md", "x.txt", "session.jsonl", "noext"])
@pytest.mark.parametrize(("head", "mime", "modality"), [s[1:] for s in SNIFF], ids=[s[0] for s in SNIFF])
def test_sniff_magic_bytes_beat_the_name(head, mime, modality, name):
    """Magic bytes decide the type whatever the file is called."""
    assert sniff(head, name) == (mime, modality)


TEXT_SNIFF = [
    (b"# Title\nbody\n", "a/b.md", ("text/markdown", "markdown")),
    (b"# Title\n", "B.MARKDOWN", ("text/markdown", "markdown")),
    (b'{"role": "user"}\n', "s.jsonl", ("application/x-ndjson", "session")),
    (b"plain words\n", "t.txt", ("text/plain", "text")),
    (b"plain words\n", "README", ("text/plain", "text")),
    (b"<html></html>", "p.html", ("text/html", "document")),
    (b"text with a \x00 NUL", "x.md", ("application/octet-stream", "binary")),
    (b"\xff\xfbmp3 frame", "song.mp3", ("audio/mpeg", "audio")),
    (b"", "empty.md", ("text/markdown", "markdown")),
]


@pytest.mark.parametrize(("head", "name", "expected"), TEXT_SNIFF)
def test_sniff_text_falls_back_to_extension(head, name, expected):
    """Without magic bytes: NUL means binary, else the extension picks the text kind."""
    assert sniff(head, name) == expected


def test_sniff_note_starting_with_id3_is_text():
    """A markdown note whose first word is 'ID3' is text, not an MP3 (no version bytes follow)."""
    assert sniff(b"ID3 tags: how mp3 metadata is stored\n", "notes/id3.md") == ("text/markdown", "markdown")


CLASSIFY = [
    ("text/markdown", "markdown", "a.md", "ok"),
    ("application/x-ndjson", "session", "a.jsonl", "ok"),
    ("text/plain", "text", "a.txt", "ok"),
    ("image/png", "image", "a.md", "failed"),
    ("application/pdf", "pdf", "a.txt", "failed"),
    ("image/png", "image", "a.png", "skipped"),
    ("application/gzip", "binary", "a.gz", "skipped"),
]


@pytest.mark.parametrize(("mime", "modality", "name", "status"), CLASSIFY)
def test_classify(mime, modality, name, status):
    """Text kinds are indexed, mismatching content fails, other kinds are skipped with a reason."""
    got, reason = classify(mime, modality, name)
    assert got == status
    assert (reason == "") is (status == "ok")


def test_png_named_md_fails_with_mismatch_reason(tmp_path):
    """A PNG renamed .md is sniffed as an image and failed with a reason naming both sides."""
    f = tmp_path / "photo.md"
    f.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    mime, modality = sniff_file(str(f), "photo.md")
    status, reason = classify(mime, modality, "photo.md")
    assert status == "failed"
    assert "image/png" in reason and ".md" in reason


def _walk(root: Path, max_bytes: int = 1000, **kw) -> dict[str, object]:
    src = SourceConfig(name="s", path=root, include=kw.get("include", DEFAULT_INCLUDE), exclude=kw.get("exclude", DEFAULT_EXCLUDE))
    return {f.path: f for f in walk_source(src, max_bytes)}


def test_walk_statuses(tmp_path):
    """Regular, empty, oversized, symlinked, fifo and hidden entries get the right status and reason."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("x")
    (root / "sub" / "note.md").write_text("hello")
    (root / "empty.md").write_bytes(b"")
    (root / "big.txt").write_bytes(b"x" * 1001)
    outside = tmp_path / "outside.md"
    outside.write_text("secret stuff")
    (root / "out_link.md").symlink_to(outside)
    (root / "in_link.md").symlink_to(root / "sub" / "note.md")
    (root / "dir_link").symlink_to(root / "sub")
    (root / "dangling.md").symlink_to(root / "missing.md")
    os.mkfifo(root / "pipe")
    got = _walk(root)
    assert set(got) == {"sub/note.md", "empty.md", "big.txt", "out_link.md", "in_link.md", "dir_link", "dangling.md", "pipe"}
    assert got["sub/note.md"].status == "ok" and got["sub/note.md"].size == 5
    assert got["sub/note.md"].abs_path == str(root / "sub" / "note.md")
    assert got["empty.md"].status == "skipped" and "empty" in got["empty.md"].reason
    assert got["big.txt"].status == "skipped" and "1001" in got["big.txt"].reason
    assert got["out_link.md"].status == "skipped" and "outside" in got["out_link.md"].reason
    assert got["in_link.md"].status == "ok" and got["in_link.md"].size == 5
    assert got["dir_link"].status == "skipped"
    assert got["dangling.md"].status == "skipped" and "broken" in got["dangling.md"].reason
    assert got["pipe"].status == "skipped" and "regular" in got["pipe"].reason
    assert all(f.shard == shard_of("s", p) for p, f in got.items())


def test_walk_missing_root_yields_nothing(tmp_path):
    """A source whose root does not exist yields no files (and does not raise)."""
    assert _walk(tmp_path / "absent") == {}


def test_walk_respects_include(tmp_path):
    """Only files matching an include glob are yielded."""
    (tmp_path / "a").mkdir()
    for name in ("a/x.md", "a/y.txt", "z.md"):
        (tmp_path / name).write_text("text")
    assert set(_walk(tmp_path, include=("**/*.md",))) == {"a/x.md", "z.md"}


def test_walk_prunes_folder_only_when_exclude_covers_its_contents(tmp_path):
    """exclude **/*.md drops markdown files, not a folder that happens to be named x.md and its .txt files."""
    (tmp_path / "archive.md").mkdir()
    (tmp_path / "archive.md" / "keep.txt").write_text("keep me")
    src_exclude = ("**/*.md",)
    assert is_selected("archive.md/keep.txt", SourceConfig("s", tmp_path, DEFAULT_INCLUDE, src_exclude))
    assert "archive.md/keep.txt" in _walk(tmp_path, exclude=src_exclude)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 17])
def test_sha256_file_matches_hashlib(tmp_path, size):
    """Streaming hash equals hashlib's on the whole content, across chunk boundaries."""
    data = os.urandom(size)
    f = tmp_path / "blob.bin"
    f.write_bytes(data)
    assert sha256_file(str(f)) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(f), chunk_size=4096) == hashlib.sha256(data).hexdigest()


_NAME_BYTES = st.binary(min_size=1, max_size=24).filter(lambda b: b"/" not in b and b"\x00" not in b and not b.startswith(b"."))
# Names that often escape to each other: ``caf\xe9`` is both a real name and the Latin-1 ``caf<E9>``
# shown escaped, and ``~2`` is how a shown name is told apart.
_CLASHING = st.lists(st.sampled_from([b"\\xe9", b"\xe9", b"\\", b"xff", b"\xff", b"~2", b"~", b"2"]), min_size=1, max_size=3).map(b"".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.lists(st.one_of(_NAME_BYTES, _CLASHING), min_size=1, max_size=6, unique=True),
    folder=st.one_of(_NAME_BYTES, _CLASHING),
    twins=st.sampled_from(["", "~2"]) | st.none(),
)
def test_any_bytes_in_a_file_or_folder_name_are_walked_and_every_record_is_text(tmp_path, files, folder, twins):
    """A name that is not UTF-8 (Latin-1 from an old disk) stopped `memory scan` and `memory index`
    whole (UnicodeEncodeError hashing it into a shard). Every name now yields a record whose path
    can be stored and hashed; a name that is not UTF-8 is reported failed, shown escaped, and so
    is a folder of such a name (its contents are not walked); every other file is indexable.
    ``twins``: each such name also has a real file named as it is shown escaped (plus ``~2``)."""
    import tempfile

    files = list(files)
    if twins is not None:
        for name in list(files):
            twin = name.decode("utf-8", "backslashreplace").encode() + twins.encode()
            if twin != name and twin not in files:
                files.append(twin)
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    broot = os.fsencode(root)
    for name in files:
        with open(os.path.join(broot, name + b".md"), "wb") as fh:
            fh.write(b"text\n")
    os.mkdir(os.path.join(broot, folder + b".d"))
    with open(os.path.join(broot, folder + b".d", b"inside.md"), "wb") as fh:
        fh.write(b"text\n")
    got = list(walk_source(SourceConfig(name="s", path=root, include=DEFAULT_INCLUDE, exclude=DEFAULT_EXCLUDE), 1000))
    for f in got:
        f.path.encode("utf-8"), f.abs_path.encode("utf-8")  # noqa: B018 - raises if not text
        assert f.shard == shard_of("s", f.path)

    def utf8(b: bytes) -> bool:
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    by_path = {f.path: f for f in got}
    # No two records share a path: an escaped name that is also a real file's name is told apart.
    assert len(by_path) == len(got), [f.path for f in got]

    def shown_as(path: str, shown: str) -> bool:
        return path == shown or (path.startswith(shown + "~") and path[len(shown) + 1 :].isdigit())

    failed = [f for f in got if f.status == "failed"]
    for name in files:
        if utf8(name):
            assert by_path[os.fsdecode(name + b".md")].status == "ok", name
        else:
            shown = (name + b".md").decode("utf-8", "backslashreplace")
            match = [f for f in failed if shown_as(f.path, shown) and "not valid UTF-8" in f.reason]
            assert match, (name, [f.path for f in got])
    if utf8(folder):
        assert by_path[os.fsdecode(folder + b".d/inside.md")].status == "ok"
    else:
        shown = (folder + b".d").decode("utf-8", "backslashreplace")
        assert [f for f in failed if f.path.endswith("/") and shown_as(f.path[:-1], shown)], [f.path for f in got]
        assert not [p for p in by_path if p.endswith("/inside.md")]
    assert len(got) == len(files) + 1


def test_an_escaped_name_that_is_also_a_real_files_name_does_not_take_its_record(tmp_path):
    """A file really named ``caf\\xe9.md`` beside a Latin-1 ``caf<E9>.md``: the Latin-1 one was
    reported under the real file's path, so the index records held one entry for both. Every run
    then wrote the real file's row again and the coverage report counted it as not indexed. The
    reported one is now shown as ``caf\\xe9.md~2``; two names whose redactions are the same are
    told apart the same way."""
    broot = os.fsencode(tmp_path)
    (tmp_path / "caf\\xe9.md").write_text("real\n")
    with open(os.path.join(broot, b"caf\xe9.md"), "wb") as fh:
        fh.write(b"latin\n")
    tokens = ["ghp_" + c * 36 for c in ("A1b2C3", "Z9y8X7")]
    for t in tokens:
        (tmp_path / f"{t}.md").write_text("text\n")
    (tmp_path / "secret-folder").mkdir()
    got = list(walk_source(SourceConfig(name="s", path=tmp_path, include=DEFAULT_INCLUDE, exclude=DEFAULT_EXCLUDE), 1000))
    by_path = {f.path: f for f in got}
    assert len(by_path) == len(got) == 4, [(f.path, f.status) for f in got]
    assert by_path["caf\\xe9.md"].status == "ok" and by_path["caf\\xe9.md"].abs_path == str(tmp_path / "caf\\xe9.md")
    assert by_path["caf\\xe9.md~2"].status == "failed" and "not valid UTF-8" in by_path["caf\\xe9.md~2"].reason
    redacted = sorted(p for p, f in by_path.items() if "secret" in f.reason)
    assert len(redacted) == 2 and redacted[1] == redacted[0] + "~2", redacted
    assert not [p for p in by_path if any(t in p for t in tokens)]


def test_a_name_that_is_not_utf8_keeps_its_secret_out_and_an_excluded_one_is_not_reported(tmp_path):
    """The escaped name of a file that is not UTF-8 is checked for secrets like any other name (a
    token in it was stored, escaped); a folder of such a name that an exclude glob covers is left
    out as any excluded folder is, not reported."""
    token = "ghp_" + "A1b2C3d4E5f6G7h8" * 2 + "Q7r8"
    broot = os.fsencode(tmp_path)
    with open(os.path.join(broot, os.fsencode(token) + b"\xe9.md"), "wb") as fh:
        fh.write(b"text\n")
    os.mkdir(os.path.join(broot, b"archive\xe9"))
    got = list(walk_source(SourceConfig(name="s", path=tmp_path, include=DEFAULT_INCLUDE, exclude=("archive*/**",)), 1000))
    assert len(got) == 1 and got[0].status == "failed", got
    assert token not in got[0].path and token not in got[0].abs_path and "secret" in got[0].reason, got[0]


def test_a_folder_whose_name_holds_a_secret_is_reported_once_and_never_shares_a_path(tmp_path):
    """Files in a folder named like an AWS key were each reported under the redacted folder,
    ``[REDACTED:aws-access-key]/a.md``: a folder really named so had its file's record taken (every
    run wrote that file's row again, coverage 0.0), and two such folders gave two records of one
    path. The folder is now reported once, redacted and told apart from its siblings, and not walked."""
    for name in ("AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLF"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.md").write_text("secret folder file\n")

    def walk() -> list:
        return list(walk_source(SourceConfig(name="s", path=tmp_path, include=DEFAULT_INCLUDE, exclude=DEFAULT_EXCLUDE), 1000))

    shown = sorted(f.path for f in walk())
    assert len(shown) == 2 and shown[0].endswith("]/") and shown[1] == shown[0][:-1] + "~2/", shown
    literal = tmp_path / shown[0].rstrip("/")
    literal.mkdir()
    (literal / "a.md").write_text("walrus lives in the literal folder\n")
    got = walk()
    by_path = {f.path: f for f in got}
    assert len(by_path) == len(got) == 3, [(f.path, f.status) for f in got]
    assert by_path[shown[0] + "a.md"].status == "ok"
    failed = [f for f in got if f.status == "failed"]
    assert len(failed) == 2 and all(f.path.endswith("/") and "folder name holds what looks like a secret" in f.reason for f in failed), failed
    assert not [f for f in got if "AKIA" in f.path or "AKIA" in f.abs_path]
    excluded = list(walk_source(SourceConfig(name="s", path=tmp_path, include=DEFAULT_INCLUDE, exclude=("AKIA*/**",)), 1000))
    assert [f.path for f in excluded] == [shown[0] + "a.md"]  # an excluded one is not reported
    # Nor one that holds nothing the source selects (as before, when its files were reported one by one).
    (tmp_path / "AKIAIOSFODNN7EXAMPLG" / "deep").mkdir(parents=True)
    (tmp_path / "AKIAIOSFODNN7EXAMPLG" / "deep" / "b.txt").write_text("text\n")
    only_md = list(walk_source(SourceConfig(name="s", path=tmp_path, include=("**/*.md",), exclude=DEFAULT_EXCLUDE), 1000))
    assert len(only_md) == 3 and len([f for f in only_md if f.status == "failed"]) == 2, [(f.path, f.status) for f in only_md]
    assert len([f for f in walk() if f.status == "failed"]) == 3  # deep/b.txt is selected by the default globs


def test_listing_a_folder_that_fails_gives_its_own_error_and_closes_each_descriptor_once(tmp_path: Path):
    """``list_folder`` of a folder that cannot be reached: its descriptor walk had closed the root's
    descriptor and then closed the same number again, so the error was EBADF ("Bad file descriptor")
    instead of the real one, and in a process with other threads the second close could shut a
    descriptor another thread had just been given."""
    from memory_pipeline.safeio import list_folder

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.md").write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    for missing in ("nope", "a/nope", "a/f.md"):
        with pytest.raises(OSError) as info:
            list_folder(tmp_path, missing)
        assert info.value.errno in (errno.ENOENT, errno.ENOTDIR), (missing, info.value)
    assert [name for name, _ in list_folder(tmp_path, "a")] == ["f.md"]
    assert len(os.listdir("/proc/self/fd")) == before
