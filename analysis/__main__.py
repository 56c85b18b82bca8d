"""Command line: `python -m analysis COMMAND ...`; each command lives in its own module, which
adds its parser with `add_command(subparsers)` and runs from `main(args)`."""

import os
import sys

from analysis import capacity, compare, diagnosis, sweep
from analysis.readers.files import RunDirError
from analysis.report import command as report
from analysis.routing import import_stats, section
from analysis.soak import command as soak
from records.cli import Parser

COMMANDS = (report, compare, soak, capacity, diagnosis, sweep, section, import_stats)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m analysis", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_command(commands)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter's final flush of
        # stdout from raising again (the recipe in Python's signal module docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
