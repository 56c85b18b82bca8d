"""The client fails loudly: without the optional [targets] packages the default run
against our server sends its schedule and ends at -t, and a target that needs one is refused
before the run in one line; an aio sender killed mid-run ends the run within seconds, non-zero,
saying the sender died, with the schedule it had not reported counted as not sent; a test ended
by two things at once writes its results; Ctrl-C ends a run cleanly, writes what it measured,
says so and exits 130."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import REPO, server_process, stop_process

pytestmark = pytest.mark.slow


def without_targets(tmp_path) -> dict:
    """An environment where smg-grpc-proto and tritonclient fail to import, as where
    `pip install -e .` left the [targets] extra out."""
    hidden = tmp_path / "hidden"
    for package in ("smg_grpc_proto", "tritonclient"):
        (hidden / package).mkdir(parents=True)
        (hidden / package / "__init__.py").write_text(
            f"raise ImportError('No module named {package} (hidden by the test)')\n")
    return os.environ | {"PYTHONPATH": f"{hidden}:{REPO}"}


def locust(host: str, run_dir, env: dict | None, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([str(REPO / ".venv/bin/locust"), "-f", "loadgen/moe.py", "--host",
                             host, "--headless", "--only-summary", "--run-dir", str(run_dir),
                             *flags], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_default_run_needs_no_optional_package(tmp_path):
    env = without_targets(tmp_path)
    with server_process(tmp_path) as (_, port):
        run = locust(f"127.0.0.1:{port}", tmp_path / "run", env, "-t", "3s", "--rate", "4",
                     "--prompt-tokens", "8", "--max-tokens", "4")
        out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, out
    assert "Traceback" not in out and "smg-grpc-proto" not in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["requests"]["ok"] > 0 and summary["generator"]["client"] == "aio"


def test_a_target_whose_package_is_missing_is_refused_in_one_line(tmp_path):
    run = locust("127.0.0.1:9", tmp_path / "run", without_targets(tmp_path), "-t", "3s",
                 "--target", "vllm-grpc")
    out, _ = run.communicate(timeout=60)
    assert run.returncode != 0 and "Traceback" not in out
    assert "--target: the engine gRPC targets need the smg-grpc-proto package: pip install -e " \
        "'.[targets]'" in out


def test_a_sender_killed_mid_run_ends_the_run_loudly(tmp_path):
    with server_process(tmp_path) as (_, port):
        run = locust(f"127.0.0.1:{port}", tmp_path / "run", None, "-t", "40s", "--rate", "4",
                     "--prompt-tokens", "8", "--max-tokens", "4")
        try:
            deadline = time.monotonic() + 30
            while not (tmp_path / "run" / "ttft.hlog").exists():  # the run has begun
                assert time.monotonic() < deadline and run.poll() is None
                time.sleep(0.1)
            time.sleep(2)
            senders = [p for p in psutil.Process(run.pid).children(recursive=True)
                       if "loadgen.aio_sender" in " ".join(p.cmdline())]
            assert len(senders) == 1
            killed_at = time.monotonic()
            os.kill(senders[0].pid, signal.SIGKILL)
            out, _ = run.communicate(timeout=30)
            ended_s = time.monotonic() - killed_at
        finally:
            stop_process(run)
    assert ended_s < 10, out
    assert run.returncode == 1, out
    assert f"the aio sender (pid {senders[0].pid}) exited with code -9" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert any(w.startswith("the run failed: the aio sender") for w in
               summary["generator"]["warnings"])
    requests = summary["requests"]
    assert requests["ok"] > 0 and requests["not_sent"] >= 0
    assert summary["duration_s"] < 15


def test_a_run_ended_by_two_things_at_once_still_writes_its_summary(tmp_path):
    """-t and a stress run's last step end the test at the same moment: one quit, whose drain
    and writing finish (a second one cut them short: exit 0 and no summary.json)."""
    with server_process(tmp_path) as (_, port):
        run = locust(f"127.0.0.1:{port}", tmp_path / "run", None, "--mode", "stress",
                     "--rate-start", "4", "--rate-mult", "1.5", "--step-s", "2", "--max-steps",
                     "2", "-t", "4s", "--prompt-tokens", "8", "--max-tokens", "4")
        out, _ = run.communicate(timeout=60)
    assert run.returncode == 0, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stress"]["steps"] and summary["requests"]["ok"] > 0


def test_ctrl_c_ends_the_run_writes_what_it_measured_and_exits_130(tmp_path):
    run_dir = tmp_path / "run"
    with server_process(tmp_path) as (_, port):
        # a terminal's Ctrl-C reaches the whole process group: the sender's and the scraper's too
        proc = subprocess.Popen([str(REPO / ".venv/bin/locust"), "-f", "loadgen/moe.py",
                                 "--host", f"127.0.0.1:{port}", "--headless", "--only-summary",
                                 "--run-dir", str(run_dir), "-t", "60s", "--rate", "5"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        time.sleep(5)  # about 3 s of schedule after Locust's start
        assert proc.poll() is None
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    assert "interrupted (Ctrl-C)" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = summary["requests"]
    assert requests["ok"] == requests["sent"] >= 5 and not requests["failed"]
    assert any(w.startswith("interrupted (Ctrl-C)") for w in summary["generator"]["warnings"])
