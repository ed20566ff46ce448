"""Files are opened once, inside their source folder: links out are refused, even ones swapped in mid-run.

The race tests flip a link between an inside file and an outside secret every ~1 ms
while sniffing, hashing and extraction run over and over; a plain ``open`` in the
same loop shows the race is live (it reads the secret), ours never does.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from memory_pipeline.discovery import inspect_file, sha256_file, sniff_file, utf8_problem
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import extract
from memory_pipeline.safeio import NotRegularFileError, UnsafeFileError, UnsafeLinkError, open_file

SECRET = "root:x:0:0:TOP-SECRET-OUTSIDE-THE-SOURCE\n"
INSIDE = "# inside\nan ordinary note inside the source folder\n"


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "memory"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "note.md").write_text(INSIDE)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text(SECRET)
    (outside / "note.md").write_text(SECRET)
    return {"root": root, "outside": outside, "inside_file": root / "sub" / "note.md", "secret": outside / "passwd"}


class Flipper:
    """A thread that swaps ``link`` between two targets every ``every`` seconds (atomically, by rename)."""

    def __init__(self, link: Path, targets: tuple[str, str], every: float = 0.001) -> None:
        self.link, self.targets, self.every = link, targets, every
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        tmp = self.link.with_name(f".{self.link.name}.flip")
        while not self.stop.is_set():
            target = self.targets[self.flips % 2]
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(target, tmp)
            os.replace(tmp, self.link)
            self.flips += 1
            time.sleep(self.every)

    def __enter__(self) -> Flipper:
        os.symlink(self.targets[0], self.link)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def test_flipping_file_link_never_reads_the_outside(tree):
    """Extract, sniff, hash and inspect under a link flipping in and out every ~1 ms: never the secret."""
    root = tree["root"]
    link = root / "flip.md"
    secret_sha = hashlib.sha256(SECRET.encode()).hexdigest()
    inside_sha = hashlib.sha256(INSIDE.encode()).hexdigest()
    counts = {"ok": 0, "refused": 0, "naive_leaks": 0}
    with Flipper(link, (str(tree["inside_file"]), str(tree["secret"]))) as flipper:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                with open(link) as fh:  # what the old code did after the walker's check
                    counts["naive_leaks"] += "TOP-SECRET" in fh.read()
            except OSError:
                pass
            for attempt in (
                lambda: extract(str(link), "markdown", root=str(root))[0].text,
                lambda: sniff_file(str(link), "flip.md", str(root)),
                lambda: sha256_file(str(link), str(root)),
                lambda: inspect_file(str(link), "flip.md", str(root)).sha256,
                lambda: utf8_problem(str(link), str(root)),
            ):
                try:
                    got = attempt()
                except UnsafeLinkError as err:
                    assert "outside its source folder" in err.reason
                    counts["refused"] += 1
                    continue
                assert "TOP-SECRET" not in str(got) and secret_sha not in str(got)
                if isinstance(got, str) and len(got) == 64:
                    assert got == inside_sha
                counts["ok"] += 1
    assert flipper.flips > 200
    # Both sides of the race were met, and a plain open() did read the secret: the race was live.
    assert counts["ok"] > 20 and counts["refused"] > 20 and counts["naive_leaks"] > 0, counts


def test_flipping_folder_link_never_reads_the_outside(tree):
    """A folder on the path flipping between an inside folder and an outside one: never the secret."""
    root = tree["root"]
    leaks = refused = ok = 0
    with Flipper(root / "dir", (str(root / "sub"), str(tree["outside"]))):
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            try:
                text = extract(str(root / "dir" / "note.md"), "markdown", root=str(root))[0].text
            except UnsafeLinkError:
                refused += 1
                continue
            except ExtractionError as err:  # the link was mid-rename: "vanished" is an honest answer
                assert "vanished" in err.reason
                continue
            leaks += "TOP-SECRET" in text
            ok += 1
    assert leaks == 0 and ok > 10 and refused > 10


def test_note_sidecar_link_flipping_never_reads_the_outside(tree, tmp_path):
    """A media file's note, a link flipping out and in, is read through the same containment."""
    from PIL import Image

    root = tree["root"]
    img = root / "photo.png"
    Image.new("RGB", (40, 30), "white").save(img)
    notes = []
    with Flipper(root / "photo.png.note.md", (str(tree["inside_file"]), str(tree["outside"] / "note.md"))):
        for _ in range(30):
            segments = extract(str(img), "image", "image/png", root=str(root), extractor=no_text)
            notes += [s.text for s in segments if s.kind == "note"]
            assert "TOP-SECRET" not in " ".join(s.text for s in segments)
            assert "TOP-SECRET" not in segments.warning
    assert notes  # some runs met the inside note


def no_text(src, mime, options):
    """A media extractor that reads nothing (the race is about the note, not the image)."""
    return []


def test_link_inside_the_root_is_followed(tree):
    """Links that stay inside the source folder keep working: relative, absolute, through a folder link."""
    root = tree["root"]
    (root / "rel.md").symlink_to("sub/note.md")
    (root / "sub" / "up.md").symlink_to("../rel.md")
    (root / "abs.md").symlink_to(tree["inside_file"])
    (root / "alias").symlink_to(root / "sub")
    for name in ("rel.md", "sub/up.md", "abs.md", "alias/note.md"):
        assert extract(str(root / name), "markdown", root=str(root))[0].text == INSIDE
        assert sha256_file(str(root / name), str(root)) == hashlib.sha256(INSIDE.encode()).hexdigest()


def test_root_given_through_a_link(tree, tmp_path):
    """A source folder configured through a link (or a path with ..) is resolved once; its files open."""
    alias = tmp_path / "alias-of-memory"
    alias.symlink_to(tree["root"])
    assert extract(str(alias / "sub" / "note.md"), "markdown", root=str(alias))[0].text == INSIDE
    assert extract(str(tree["inside_file"]), "markdown", root=str(alias))[0].text == INSIDE


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda t: (t["root"] / "out.md").symlink_to(t["secret"]) or t["root"] / "out.md", id="file link"),
        pytest.param(lambda t: (t["root"] / "rel.md").symlink_to("../outside/passwd") or t["root"] / "rel.md", id="relative"),
        pytest.param(lambda t: (t["root"] / "d").symlink_to(t["outside"]) or t["root"] / "d" / "passwd", id="folder link"),
        pytest.param(
            lambda t: (t["root"] / "hop.md").symlink_to("sub/hop2.md") or (t["root"] / "sub" / "hop2.md").symlink_to(t["secret"]) or t["root"] / "hop.md",
            id="two hops",
        ),
        pytest.param(lambda t: t["root"] / ".." / "outside" / "passwd", id="dot-dot"),
    ],
)
def test_links_leading_outside_are_refused(tree, make):
    """A link (or a path) that leads outside the source folder is refused with a reason, by every reader."""
    path = str(make(tree))
    root = str(tree["root"])
    for call in (
        lambda: extract(path, "markdown", root=root),
        lambda: sniff_file(path, "x.md", root),
        lambda: sha256_file(path, root),
        lambda: inspect_file(path, "x.md", root),
    ):
        with pytest.raises(UnsafeLinkError) as info:
            call()
        assert "outside its source folder" in info.value.reason or "not inside its source folder" in info.value.reason
        assert isinstance(info.value, ExtractionError)  # recorded per file, never aborts a run


def test_link_loop_is_refused(tree):
    root = tree["root"]
    (root / "a.md").symlink_to("b.md")
    (root / "b.md").symlink_to("a.md")
    with pytest.raises(UnsafeLinkError, match="links to follow"):
        extract(str(root / "a.md"), "markdown", root=str(root))


def _within(seconds: float, fn):
    """fn() run in a thread; fails the test if it has not returned in time (a FIFO open would block)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # handed to the test thread
            out["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value")


@pytest.mark.parametrize("root_given", [True, False])
def test_fifo_is_refused_without_hanging(tree, root_given):
    """A FIFO named like a note is refused at once (no writer ever comes), with or without a root."""
    fifo = tree["root"] / "pipe.md"
    os.mkfifo(fifo)
    root = str(tree["root"]) if root_given else None
    for call in (
        lambda: extract(str(fifo), "markdown", root=root),
        lambda: sniff_file(str(fifo), "pipe.md", root),
        lambda: sha256_file(str(fifo), root),
    ):
        with pytest.raises(NotRegularFileError, match="FIFO"):
            _within(5, call)
    # A link inside the root to the FIFO is no better.
    (tree["root"] / "to-pipe.md").symlink_to(fifo)
    with pytest.raises(NotRegularFileError):
        _within(5, lambda: extract(str(tree["root"] / "to-pipe.md"), "markdown", root=str(tree["root"])))


def test_device_and_folder_are_refused(tree):
    with pytest.raises(NotRegularFileError, match="device"):
        open_file("/dev/null")
    with pytest.raises(NotRegularFileError, match="folder"):
        open_file(str(tree["root"] / "sub"), tree["root"])


def test_without_root_a_link_is_never_followed(tree):
    """An old caller that passes no root: the file itself must not be a link (even one pointing inside)."""
    link = tree["root"] / "in.md"
    link.symlink_to(tree["inside_file"])
    with pytest.raises(UnsafeLinkError, match="no source folder"):
        extract(str(link), "markdown")
    assert extract(str(tree["inside_file"]), "markdown")[0].text == INSIDE


def test_reads_come_from_the_descriptor_not_the_path(tree):
    """Once open, renaming or replacing the path changes nothing: readers see the opened file."""
    path = tree["root"] / "swap.md"
    path.write_text(INSIDE)
    with open_file(str(path), tree["root"]) as f:
        os.replace(tree["secret"], path)
        assert f.pread(1000).decode() == INSIDE
        with f.stream() as fh:
            assert fh.read().decode() == INSIDE
        with open(f.tool_path(), "rb") as again:  # what a child given the descriptor opens
            assert again.read().decode() == INSIDE


def test_unsafe_errors_are_extraction_errors():
    assert issubclass(UnsafeLinkError, UnsafeFileError) and issubclass(NotRegularFileError, UnsafeFileError)
    assert issubclass(UnsafeFileError, ExtractionError)


def test_walker_never_lists_a_folder_swapped_for_a_link(tree):
    """A folder replaced by a link to the outside between the walker's lstat and its listing is not listed."""
    from memory_pipeline.discovery import walk_source
    from memory_pipeline.settings import SourceConfig

    root = tree["root"]
    folder, parked = root / "d", root.parent / "parked"
    folder.mkdir()
    (folder / "x.md").write_text("inside")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(folder, parked)
            os.symlink(tree["outside"], folder)
            time.sleep(0.0005)
            os.unlink(folder)
            os.rename(parked, folder)
            time.sleep(0.0005)

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    seen: set[str] = set()
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            seen |= {f.path for f in walk_source(SourceConfig("s", root, ("**/*",), ()), 10_000)}
    finally:
        stop.set()
        thread.join(5)
    assert "d/x.md" in seen
    assert not {"d/passwd", "d/note.md"} & seen, seen
