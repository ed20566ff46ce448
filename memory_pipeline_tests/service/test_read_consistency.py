"""Reads never wait for writes, and never see a half-written file.

One note is rewritten again and again between two versions (A: a few chunks of its own words, B:
more chunks of other words) through the server's own write route (POST /api/memory/notes) and
through `memory index` runs in another process for the file rewritten on disk, while threads
search it over HTTP. Every answer must hold the file's rows of exactly one version, all of them:
never none (a delete committed before its insert) and never a mix (old rows beside new ones).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import pytest

from memory_pipeline_tests.service.conftest import Server, make_memory, memory

pytestmark = pytest.mark.slow

REL = "race/lighthouse.md"
QUERY = "lighthouse keeper logged readings at the north pier"
VERSIONS = {"A": ("amberfjord", 3), "B": ("cobaltmoor", 5)}  # the version's word, its sections (chunks)
SEARCHERS = 3
MAX_REWRITES = 20
DEADLINE_S = 40  # past it, the race ends once both routes wrote (MAX_REWRITES bounds it too)


def version_text(name: str) -> str:
    """Sections of a chunk or two each (chunking.tokens is 48): every line carries the
    version's word and its section's marker (``amberfjord2``), so any snippet says where it is from."""
    word, sections = VERSIONS[name]
    return "\n".join(
        f"## {word} watch {i}\n"
        f"{word}{i}: the lighthouse keeper logged {word} readings at the north pier.\n"
        f"{word}{i}: the lamp of {word} section {i} was trimmed before dusk.\n"
        for i in range(1, sections + 1)
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = make_memory(tmp_path_factory.mktemp("consistency"), chunking={"tokens": 48, "overlap": 0})
    srv = Server(config)
    yield srv
    srv.stop()


def search(http: httpx.Client) -> httpx.Response:
    return http.post("/api/memory/search", json={"query": QUERY, "path": REL, "min_score": 0, "max_results": 50})


def version_seen(resp: httpx.Response, whole: dict[str, frozenset[str]] | None = None) -> str:
    """The one version every row of the answer belongs to (by its words); with ``whole`` (each
    version's chunk ids), the answer must hold exactly that version's rows. Else an AssertionError
    that says what was seen."""
    assert resp.status_code == 200, resp.text
    rows = resp.json()["results"]
    assert rows, "none of the file's rows (neither version whole)"
    assert all(r["path"].endswith(REL) for r in rows), [r["path"] for r in rows]
    per_row = []
    for r in rows:
        text = f"{r['heading']}\n{r['snippet']}"
        names = [name for name, (word, _) in VERSIONS.items() if word in text]
        assert len(names) == 1, f"a row of no single version: {text!r}"
        per_row.append(names[0])
    seen = set(per_row)
    assert len(seen) == 1, f"a mix of versions: {dict(Counter(per_row))} rows"
    name = seen.pop()
    word, sections = VERSIONS[name]
    markers = {m for i in range(1, sections + 1) for r in rows if (m := f"{word}{i}") in r["heading"] + r["snippet"]}
    assert len(markers) == sections, f"version {name}: only sections {sorted(markers)} of {sections}"
    ids = [r["chunk_id"] for r in rows]
    assert len(set(ids)) == len(ids), f"version {name}: a chunk twice in {ids}"
    if whole is not None:
        assert set(ids) == whole[name], f"version {name}: {len(ids)} rows, not its {len(whole[name])} ({sorted(set(ids) ^ whole[name])} differ)"
    return name


def chunk_ids(resp: httpx.Response) -> frozenset[str]:
    return frozenset(r["chunk_id"] for r in resp.json()["results"])


def write_by_note(srv: Server, name: str) -> None:
    resp = srv.http.post("/api/memory/notes", json={"text": version_text(name), "path": REL, "append": False})
    assert resp.status_code == 200, resp.text
    assert resp.json()["indexed"] is True


def write_by_index_run(srv: Server, name: str) -> None:
    path = srv.config.parent / "mem" / REL
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(version_text(name))
    done = memory("index", "--config", str(srv.config), "--quiet", cwd=srv.config.parent)
    assert done.returncode == 0, done.stderr


def test_a_search_racing_rewrites_of_the_same_file_sees_its_old_rows_or_its_new_rows(served):
    srv = served
    # Each version alone, before the race: its rows (the same for either route: the same text).
    whole: dict[str, frozenset[str]] = {}
    for name, write in (("A", write_by_index_run), ("B", write_by_note), ("A", write_by_note), ("B", write_by_index_run)):
        write(srv, name)
        resp = search(srv.http)
        assert version_seen(resp) == name
        assert whole.setdefault(name, chunk_ids(resp)) == chunk_ids(resp)
    assert len(whole["A"]) >= 2 and len(whole["B"]) > len(whole["A"]), {k: len(v) for k, v in whole.items()}

    seen: Counter[str] = Counter()
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def searcher() -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            while not stop.is_set():
                try:
                    name = version_seen(search(http), whole)
                except AssertionError as err:
                    with lock:
                        failures.append(f"{time.monotonic() - started:.2f}s during {doing}: {str(err).splitlines()[0]}")
                    continue
                with lock:
                    seen[name] += 1

    started = time.monotonic()
    doing = "nothing"  # the write under way, for the failures' messages
    threads = [threading.Thread(target=searcher, name=f"searcher-{k}") for k in range(SEARCHERS)]
    for t in threads:
        t.start()
    writes: Counter[str] = Counter()
    current = "B"
    try:
        # A→B→A…: two writes by the server's route, then one by a `memory index` run; until both
        # versions were seen by racing searches (and both routes wrote), or the bounds are reached.
        for k in range(MAX_REWRITES):
            current = "B" if current == "A" else "A"
            route = "index" if k % 3 == 2 else "note"
            doing = f"{route} #{k} writing {current}"
            (write_by_index_run if route == "index" else write_by_note)(srv, current)
            doing = f"nothing (after {route} #{k} wrote {current}, fold pending: {srv.http.get('/api/memory/status').json()['fold_pending']})"
            writes[route] += 1
            with lock:
                enough = seen["A"] and seen["B"] and writes["index"] and writes["note"] >= 2 and k >= 5
            # The deadline bounds the race once both routes wrote (a loaded machine took 41.6 s
            # over its first two writes, and the race stopped before an index run had written).
            if enough or failures or (time.monotonic() - started > DEADLINE_S and writes["index"] and writes["note"]):
                break
        time.sleep(0.5)  # searches of the last version too
    finally:
        stop.set()
        for t in threads:
            t.join()
    elapsed = time.monotonic() - started
    print(f"\nsearches saw A {seen['A']}x, B {seen['B']}x; writes {dict(writes)}; {elapsed:.1f} s")
    assert not failures, f"{len(failures)} inconsistent answers of {len(failures) + sum(seen.values())}:\n" + "\n".join(failures[:10])
    assert seen["A"] and seen["B"], f"the race proves nothing: searches saw {dict(seen)} over writes {dict(writes)}"
    assert writes["index"] and writes["note"]
    assert version_seen(search(srv.http), whole) == current  # the last write is what stays
