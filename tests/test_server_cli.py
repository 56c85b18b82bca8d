"""`python -m server` refuses bad flag values before building anything, naming the flag."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("flags, named", [
    (["--max-batch-size", "0"], "--max-batch-size: must be at least 1"),
    (["--preset", "huge"], "--preset: unknown 'huge'; choose from tiny, small"),
    (["--policy", "lifo"], "--policy: unknown 'lifo'"),
    (["--port", "70000"], "--port: must be 0..65535"),
    (["--dtype", "int8"], "--dtype: must be one of"),
])
def test_bad_flag_exits_2_naming_it(flags, named):
    done = subprocess.run([sys.executable, "-m", "server", *flags], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert named in done.stderr
