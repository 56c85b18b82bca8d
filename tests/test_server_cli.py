"""`python -m server` refuses bad flag values before building anything, naming the flag."""

import socket
import subprocess
import sys
import time

import pytest
import torch

from server.__main__ import parse_args
from server.settings import device_problem
from tests.conftest import REPO, server_process


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
    err = capsys.readouterr().err
    assert named in err
    # one line: the error and where to look, never the usage block
    assert err.count("\n") == 1 and err.rstrip().endswith("(see python -m server --help)")


def test_an_unknown_flag_is_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--polcy", "fcfs"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert "unrecognized arguments: --polcy fcfs" in err


@pytest.mark.slow
def test_the_entry_point_refuses_before_building_a_model():
    done = subprocess.run([sys.executable, "-m", "server", "--max-batch-size", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--max-batch-size: must be at least 1" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--http-port"])
def test_a_busy_port_is_refused_in_one_line_naming_its_flag(tmp_path, flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        flags = ["--port", str(busy)] if flag == "--port" else ["--port", "0", flag, str(busy)]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "server", "--preset", "tiny", *flags],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and time.monotonic() - started < 30
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"python -m server: error: {flag}: cannot listen on 127.0.0.1:{busy}")
    assert "serving" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_running_server_keeps_its_port(tmp_path):
    with server_process(tmp_path) as (_, port):
        done = subprocess.run([sys.executable, "-m", "server", "--preset", "tiny", "--port",
                               str(port)], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "another server may be running there" in done.stderr


@pytest.mark.slow
def test_two_listeners_on_one_port_are_refused():
    done = subprocess.run([sys.executable, "-m", "server", "--preset", "tiny", "--port", "50999",
                           "--http-port", "50999"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--http-port: 50999 is also --port" in done.stderr


def test_a_gpu_the_machine_lacks_is_named_with_those_it_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda:2") == "cuda:2: torch sees 2 CUDA device(s), cuda:0 to cuda:1"
    assert device_problem("cuda:1") is None and device_problem("cuda") is None
    assert device_problem("cpu") is None
