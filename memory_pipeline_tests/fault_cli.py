"""`memory` with injected stage hooks: kill the process with SIGKILL at a named point of a run.

    python -m memory_pipeline_tests.fault_cli --kill-at POINT [--embed-slice N] -- index --config ...

Production code reads no test switch from the environment: the hooks are handed to
``cli.main`` (→ ``runner.run_index`` → the ``stage_hooks`` resource → the stages).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass

from memory_pipeline.stages.hooks import POINTS, StageHooks


@dataclass(frozen=True)
class KillAt(StageHooks):
    point: str = ""

    def at(self, point: str) -> None:
        if point == self.point:
            os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fault_cli")
    parser.add_argument("--kill-at", choices=POINTS, required=True)
    parser.add_argument("--embed-slice", type=int, default=StageHooks.embed_slice)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    from memory_pipeline.cli import main as memory

    return memory(rest, hooks=KillAt(embed_slice=args.embed_slice, point=args.kill_at))


if __name__ == "__main__":
    sys.exit(main())
