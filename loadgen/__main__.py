"""`python -m loadgen --help`: the load generator's own options, grouped by purpose. The load
generator runs under Locust (`locust -f loadgen/moe.py ...`), whose `--help` prints Locust's
options only: it prints help before it reads a locustfile."""

from __future__ import annotations

import argparse
import sys

from loadgen.settings import REGISTRIES
from records.cli import Parser
from records.declare import add_arguments
from records.load_settings import LoadSettings

USAGE = "locust -f loadgen/moe.py --host HOST:PORT [Locust's options] [the options below]"
EPILOG = ("Locust's own options (-u, -t, --headless, --web-port, --csv, --processes, ...): "
          "locust --help. In the web UI, these options are the start form's custom parameters. "
          "Examples: README.md; the targets: docs/targets.md.")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m loadgen", usage=USAGE, epilog=EPILOG,
                                description="The load generator for MoE inference servers: "
                                            "open-loop streaming requests timed over the wire.")
    add_arguments(p, LoadSettings, REGISTRIES)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    if argv in ([], ["-h"], ["--help"]):
        p.print_help()
        return 0
    p.print_usage(sys.stderr)
    print("python -m loadgen only lists the options; run a test with: locust -f loadgen/moe.py "
          "--host HOST:PORT " + " ".join(argv), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
