"""`python -m server` refuses bad flag values before building anything, naming the flag."""

import subprocess
import sys

import pytest

from server.__main__ import parse_args
from tests.conftest import REPO


@pytest.mark.parametrize("flags, named", [
    (["--max-batch-size", "0"], "--max-batch-size: must be at least 1"),
    (["--preset", "huge"], "--preset: unknown 'huge'; choose from tiny, small"),
    (["--policy", "lifo"], "--policy: unknown 'lifo'"),
    (["--port", "70000"], "--port: must be 0..65535"),
    (["--http-port", "-1"], "--http-port: must be 0..65535"),
    (["--http-port-file", "p"], "--http-port-file: needs --http-port"),
    (["--dtype", "int8"], "--dtype: unknown 'int8'; choose from float32"),
    (["--routing-skew", "hot:0.9"],
     "--routing-skew: skew hot:0.9: one expert can hold at most 1/k"),
    (["--router", "nope"], "--router: unknown router 'nope'"),
    (["--moe-kernel", "fast"], "--moe-kernel: unknown 'fast'"),
    (["--capacity-factor", "0"], "--capacity-factor: must be above 0"),
    (["--cache-policy", "fifo"], "--cache-policy: unknown 'fifo'"),
    (["--max-queue", "0"], "--max-queue: must be at least 1"),
])
def test_bad_flag_exits_2_naming_it(flags, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(flags)
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_the_entry_point_refuses_before_building_a_model():
    done = subprocess.run([sys.executable, "-m", "server", "--max-batch-size", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--max-batch-size: must be at least 1" in done.stderr
