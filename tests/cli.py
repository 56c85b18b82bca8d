"""`python -m analysis ...` run inside the test process: the command's own `main`, its output
captured, argparse's exits caught. The same code as the command line, without a new interpreter
and matplotlib's import per call; tests/test_analysis.py also runs the real command once."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from analysis.__main__ import main


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def analysis(*argv) -> Done:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([str(arg) for arg in argv])
        except SystemExit as exit_:  # argparse refusing a flag
            code = exit_.code
    return Done(code, out.getvalue(), err.getvalue())
