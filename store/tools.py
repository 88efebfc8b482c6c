"""The ``basalt store`` command group: ``check`` and ``dump`` on a store root, read-only.

The work lives in :mod:`basalt.store.consistency` (the consistency verifier) and
:mod:`basalt.store.dump` (the record printer), both over the read-only loaders of
:mod:`basalt.store.readonly`; this module only parses arguments, prints, and maps
outcomes to exit statuses: :data:`EXIT_OK` (0), :data:`EXIT_INCONSISTENT` (1:
the store is inconsistent, or a dump stopped at a corrupt record) and
:data:`EXIT_USAGE` (2: a bad root). ``check_store``, ``CheckReport``,
``dump_store`` and ``StoreRootError`` are re-exported for existing callers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from basalt.store.consistency import CheckReport, check_store
from basalt.store.dump import DEFAULT_BODY_PREVIEW_BYTES, dump_store
from basalt.store.readonly import StoreRootError

__all__ = [
    "EXIT_INCONSISTENT",
    "EXIT_OK",
    "EXIT_USAGE",
    "CheckReport",
    "CommandHandler",
    "StoreRootError",
    "add_store_commands",
    "check_store",
    "dump_store",
    "run_check",
    "run_dump",
]

#: Exit statuses of the ``basalt store`` commands.
EXIT_OK = 0
EXIT_INCONSISTENT = 1
EXIT_USAGE = 2

# -- the ``basalt store`` command group ------------------------------------------------------

#: A command: parsed arguments, stdout, stderr -> exit status.
CommandHandler = Callable[[argparse.Namespace, TextIO, TextIO], int]


def _non_negative_int(text: str) -> int:
    try:
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def add_store_commands(parser: argparse.ArgumentParser) -> None:
    """Add ``check`` and ``dump`` under ``parser`` (the ``basalt.store`` group).

    Each subcommand sets ``handler`` (a :data:`CommandHandler`) in the namespace.
    """
    sub = parser.add_subparsers(dest="store_command", metavar="COMMAND", required=True)
    check = _add_command(
        sub,
        "check",
        run_check,
        help_text="verify a store root (read-only)",
        description="Verify every CommitLog record and every ConsumeQueue unit of a store "
        "root, read-only (safe beside a running store). Exit 0 when consistent, 1 on any "
        "inconsistency, 2 on a usage error.",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.add_argument(
        "--max-hash-slot-num",
        type=_non_negative_int,
        metavar="N",
        help="the store's IndexFile hash slots (with --max-index-num; default: inferred "
        "from the files' size, 4 entries a slot)",
    )
    check.add_argument(
        "--max-index-num", type=_non_negative_int, metavar="N", help="the store's IndexFile entries"
    )
    check.add_argument(
        "--mapped-file-size-commit-log",
        type=_non_negative_int,
        metavar="BYTES",
        help="the store's CommitLog file size, which every CommitLog file must be "
        "(default: the most common size on disk; a one-file store's file is then not judged)",
    )
    dump = _add_command(
        sub,
        "dump",
        run_dump,
        help_text="print records, one per line (read-only)",
        description="Print CommitLog records like kafka-dump-log. With --topic and --queue, "
        "iterate that ConsumeQueue and read --from-offset as a queue offset; otherwise walk "
        "the CommitLog and read it as a physical offset.",
    )
    dump.add_argument("--topic", help="only records of this topic")
    dump.add_argument("--queue", type=_non_negative_int, help="only records of this queue id")
    dump.add_argument("--from-offset", type=_non_negative_int, metavar="N", help="start here")
    dump.add_argument(
        "--body-bytes",
        type=_non_negative_int,
        default=DEFAULT_BODY_PREVIEW_BYTES,
        metavar="N",
        help=f"body preview length (default {DEFAULT_BODY_PREVIEW_BYTES})",
    )


def _add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: CommandHandler,
    *,
    help_text: str,
    description: str,
) -> argparse.ArgumentParser:
    """A subcommand taking the store root as its one positional argument."""
    command = sub.add_parser(name, help=help_text, description=description)
    command.add_argument("root", type=Path, metavar="ROOT", help="the store root directory")
    command.set_defaults(handler=handler)
    return command


def run_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``basalt store check``: 0 consistent, 1 inconsistent, 2 bad root."""
    try:
        slots = getattr(args, "max_hash_slot_num", None)
        entries = getattr(args, "max_index_num", None)
        geometry = (slots, entries) if slots and entries else None
        report = check_store(
            args.root,
            index_geometry=geometry,
            commitlog_file_size=getattr(args, "mapped_file_size_commit_log", None) or None,
        )
    except StoreRootError as e:
        err.write(f"basalt store check: error: {e}\n")
        return EXIT_USAGE
    if args.json:
        out.write(json.dumps(report.as_dict(), ensure_ascii=False) + "\n")
    else:
        out.write(report.summary() + "\n")
    return EXIT_OK if report.ok else EXIT_INCONSISTENT


def run_dump(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``basalt store dump``: 0 done, 1 stopped at a corrupt record, 2 bad root."""
    try:
        result = dump_store(
            args.root,
            out,
            topic=args.topic,
            queue_id=args.queue,
            from_offset=args.from_offset,
            body_bytes=args.body_bytes,
        )
    except StoreRootError as e:
        err.write(f"basalt store dump: error: {e}\n")
        return EXIT_USAGE
    if not result.ok:
        err.write(f"basalt store dump: {result.error}\n")
    return EXIT_OK if result.ok else EXIT_INCONSISTENT
