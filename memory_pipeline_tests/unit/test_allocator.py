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

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")

# 16 MiB freed first: glibc (moving threshold) then serves blocks of up to 16 MiB from the heap.
# 128 blocks of 1 MiB, then one more that stays allocated above them, then the 128 freed: with the
# moving threshold they stay resident (the block above pins the heap's top); fixed, each was mapped
# on its own and is unmapped by its free.
PROBE = """
import json, sys
def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
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


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MEMORY_PIPELINE_MALLOC"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean | env, capture_output=True, text=True, timeout=120, check=True)
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
