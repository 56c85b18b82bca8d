"""`python -m analysis ...` and `python -m experiments ...` run inside the test process: the
command's own `main`, its output captured, its exits caught. The same code as the command line,
without a new interpreter and matplotlib's import per call; tests/test_analysis.py and
tests/test_compare_policies.py also run the real commands."""

from __future__ import annotations

import io
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

from analysis.__main__ import main as analysis_main
from experiments.__main__ import main as experiments_main


@dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


def in_process(main: Callable[[list[str]], int], *argv) -> Done:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([str(arg) for arg in argv])
        except SystemExit as exit_:  # argparse refusing a flag; a message exits 1, printed
            code = exit_.code if isinstance(exit_.code, int) else 1
            if not isinstance(exit_.code, int):
                print(exit_.code, file=err)
    return Done(code, out.getvalue(), err.getvalue())


def analysis(*argv) -> Done:
    return in_process(analysis_main, *argv)


def experiments(*argv) -> Done:
    return in_process(experiments_main, *argv)
