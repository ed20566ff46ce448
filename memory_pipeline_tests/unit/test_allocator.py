"""glibc's mmap threshold fixed on import (``memory_pipeline.allocator``): memory freed in blocks of
a few MiB leaves the process, where glibc's moving threshold would keep it resident.

Each case runs in a fresh interpreter: the threshold is a process-wide setting, and what it changes
is what the process holds after a free, read from ``/proc/self/status``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# The probes' resident size, in MiB, read from /proc.
RSS = """
def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

# 16 MiB freed first: glibc (moving threshold) then serves blocks of up to 16 MiB from the heap.
# 128 blocks of 1 MiB, then one more that stays allocated above them, then the 128 freed: with the
# moving threshold they stay resident (the block above pins the heap's top); fixed, each was mapped
# on its own and is unmapped by its free.
PROBE = (
    RSS
    + """
import json, sys
import memory_pipeline
from memory_pipeline.allocator import tune_allocator
big = bytearray(16 * 2**20)
del big
blocks = [bytearray(2**20) for _ in range(128)]
keep = bytearray(2**20)
before = rss()
del blocks
print(json.dumps({"held_mb": rss() - (before - 128), "tuned": tune_allocator()}))
"""
)


def _probe(code: str = "", **env: str) -> dict:
    """Run ``code`` (default: PROBE) in a fresh interpreter without any allocator setting of this
    environment's, plus ``env``; its last line of output, as JSON."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "ARROW_")) and k != "MEMORY_PIPELINE_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code or PROBE], env=clean | env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_blocks_leave_the_process():
    got = _probe()
    assert got["tuned"] is True
    assert got["held_mb"] < 16, got


def test_opt_out_keeps_glibcs_behaviour():
    # The same probe without the tuning holds the freed blocks: what the tuning changes is real.
    got = _probe(MEMORY_PIPELINE_MALLOC="default")
    assert got["tuned"] is False
    assert got["held_mb"] > 100, got


def test_the_users_own_glibc_tuning_wins():
    got = _probe(MALLOC_TOP_PAD_="0")
    assert got["tuned"] is False


# Arrow work of the kind the stages do (string columns built, computed on and dropped), then what
# the process still holds. pyarrow's bundled mimalloc keeps most of it; the system pool, under the
# fixed threshold, gives it back.
ARROW_PROBE = (
    RSS
    + """
import json, time
import memory_pipeline
import pyarrow as pa
import pyarrow.compute as pc
base = rss()
for _ in range(20):
    arrs = [pa.array([f"text {i} " * 20 for i in range(20000)]) for _ in range(4)]
    t = pa.table({f"c{i}": a for i, a in enumerate(arrs)})
    u = pc.utf8_upper(t["c0"])
    del arrs, t, u
time.sleep(0.2)
print(json.dumps({"pool": pa.default_memory_pool().backend_name, "held_mb": rss() - base}))
"""
)


def test_arrow_buffers_come_from_the_system_pool_and_go_back():
    got = _probe(ARROW_PROBE)
    assert got["pool"] == "system"
    assert got["held_mb"] < 32, got


def test_a_pool_the_user_chose_wins_and_keeps_its_memory():
    got = _probe(ARROW_PROBE, ARROW_DEFAULT_MEMORY_POOL="mimalloc")
    assert got["pool"] == "mimalloc"
    assert got["held_mb"] > 40, got  # what the system pool gives back is real


def test_opt_out_leaves_arrows_pool_alone():
    got = _probe(ARROW_PROBE, MEMORY_PIPELINE_MALLOC="default")
    assert got["pool"] != "system"


# A model's passes allocate and free the same few MiB again and again: under the fixed threshold each
# block is mapped and its pages faulted in afresh; inside ``model_buffers_on_heap`` the heap reuses
# them. On leaving, the threshold is fixed again (the churn faults as before) and the heap's free
# pages are given back.
HEAP_PROBE = (
    RSS
    + """
import json, resource
import memory_pipeline
from memory_pipeline.allocator import model_buffers_on_heap
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def churn():
    start = faults()
    for _ in range(50):
        block = b"x" * (4 * 2**20)  # malloc'd and written: every page touched
        del block
    return faults() - start
outside = churn()
with model_buffers_on_heap():
    inside = churn()
    with model_buffers_on_heap():  # nested (another thread's pass): the outer one keeps the heap on
        pass
    nested = churn()
after = churn()
base = rss()
with model_buffers_on_heap():
    blocks = [b"y" * 2**20 for _ in range(64)]
    keep = b"z" * 2**20
    del blocks
    held_inside = rss() - base
after_rss = rss() - base
print(json.dumps({"outside": outside, "inside": inside, "nested": nested, "after": after, "held_inside": held_inside, "held_after": after_rss}))
"""
)


def test_model_buffers_are_reused_inside_and_given_back_after():
    got = _probe(HEAP_PROBE)
    pages = 50 * 1024  # 50 blocks of 1,024 pages
    assert got["outside"] > pages * 0.9, got  # each block mapped and faulted in afresh
    assert got["inside"] < pages * 0.1, got  # reused from the heap
    assert got["nested"] < pages * 0.1, got
    assert got["after"] > pages * 0.9, got  # fixed again on leaving
    assert got["held_inside"] > 48, got  # freed under a live block: the heap holds it...
    assert got["held_after"] < 16, got  # ...until the window closes and trims it


def test_opt_out_leaves_the_model_window_alone():
    got = _probe(HEAP_PROBE, MEMORY_PIPELINE_MALLOC="default")
    pages = 50 * 1024
    # glibc's own moving threshold: the first free raises it, the rest reuse the heap either way.
    assert got["outside"] < pages * 0.1 and got["after"] < pages * 0.1, got
