"""python -m experiments compare-policies ... (docs/compare.md)"""

import argparse
import sys

from analysis.readers.files import RunDirError
from experiments import compare_policies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments")
    commands = parser.add_subparsers(dest="command", required=True)
    compare_policies.add_command(commands)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RunDirError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
