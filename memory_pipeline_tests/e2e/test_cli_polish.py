"""Issue 12, CLI polish: --version, help with an example on every option, problem files in `memory analytics`,
and an analytics database that keeps working when the data folder is copied elsewhere."""

from __future__ import annotations

import argparse
import re

from memory_pipeline import __version__
from memory_pipeline.cli import build_parser
from memory_pipeline_tests.helpers import run_cli

EXAMPLE = re.compile(r"e\.g\.|example", re.IGNORECASE)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_version_prints_name_and_version():
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"memory_pipeline {__version__}"


def test_every_option_has_help_with_an_example_and_every_subcommand_an_example():
    parser = build_parser()
    subs = _subparsers(parser)
    assert {"index", "search", "store", "eval", "scan", "analytics", "generations", "doctor", "status"} <= set(subs)
    missing = []
    for name, p in [("memory", parser), *subs.items()]:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not (action.help and action.help.strip() and EXAMPLE.search(action.help)):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: {action.help!r}")
    assert not missing, "options without help or an example:\n" + "\n".join(missing)
    for name, p in subs.items():
        assert p.description, name
        assert (p.epilog or "").startswith("Example"), name
        assert p.formatter_class is argparse.RawDescriptionHelpFormatter, name
        assert f"memory {name}" in p.epilog, name
        # The example line survives formatting as written.
        assert p.epilog.splitlines()[1] in p.format_help(), name
