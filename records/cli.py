"""The project's command lines: argparse, but a bad flag or value is one line, the error and
where to look, never the usage block (exit 2). Every CLI of server/, loadgen/ and analysis/ uses
it; the README lists the exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_ERROR = 2  # a bad flag, a bad value, or a target that cannot be reached
INTERRUPTED = 130  # ended by Ctrl-C (128 + SIGINT, as shells report it), what ran written


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(USAGE_ERROR)
