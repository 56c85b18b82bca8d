"""Other load generators, run by `make bench-loadgen` beside ours at rest against the openai
known-delay server: AIPerf and GuideLLM, where installed (`make peers` puts each in a virtual
environment of its own under .venv-peers/, since their pins are not ours; else on PATH). A peer
that is absent, or that fails, is a row skipped with the reason.

Both count tokens with a Hugging Face tokenizer; with no hub here, they get a word-level one
written for the run (the reference server streams the word "tok" a token). Both time TTFT from
their own send of each request; ours from its scheduled time, so ours also carries its send lag.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent.parent / ".venv-peers"
PEERS = ("aiperf", "guidellm")
RUN_TIMEOUT_S = 300


def find(name: str) -> str | None:
    """The peer's command: from make peers' environment, else on PATH."""
    own = PEERS_DIR / name / "bin" / name
    return str(own) if own.exists() else shutil.which(name)


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer the peers' transformers can load offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    words = ["[UNK]", "tok", *(f"w{i}" for i in range(254))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                           unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
         "model_max_length": 4096}))
    return directory


@dataclass(frozen=True)
class PeerRun:
    """What every peer is asked to send: `count` requests of `tokens` output tokens at `rate`
    requests/s (Poisson) to url, with the tokenizer write_tokenizer made."""

    url: str
    rate: float
    count: int
    tokens: int
    seed: int
    tokenizer: Path


def aiperf(exe: str, run: PeerRun, out: Path) -> dict:
    subprocess.run([exe, "profile", "--model", "delay", "--url", run.url, "--endpoint-type",
                    "completions", "--streaming", "--request-rate", str(run.rate),
                    "--request-rate-mode", "poisson", "--request-count", str(run.count),
                    "--tokenizer", str(run.tokenizer), "--isl", "4", "--osl", str(run.tokens),
                    "--random-seed", str(run.seed), "--ui-type", "none", "--artifact-dir",
                    str(out), "--no-server-metrics"],
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    ttft = json.loads((out / "profile_export_aiperf.json").read_text())["time_to_first_token"]
    return {"ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"]}


def guidellm(exe: str, run: PeerRun, out: Path) -> dict:
    report = out / "guidellm.json"
    subprocess.run([exe, "run", "--backend", f"kind=openai_http,target={run.url},model=delay",
                    "--profile", f"kind=poisson,rate={run.rate}",
                    "--constraint", f"kind=max_requests,count={run.count}",
                    "--data", f"kind=synthetic_text,prompt_tokens=4,output_tokens={run.tokens}",
                    "--tokenizer", f"kind=hf_auto,model={run.tokenizer}",
                    "--output", f"kind=json,path={report}", "--disable-console"],
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S, cwd=out)
    ttft = json.loads(report.read_text())["benchmarks"][0]["metrics"][
        "time_to_first_token_ms"]["successful"]
    return {"ttft_p50_ms": ttft["percentiles"]["p50"], "ttft_p99_ms": ttft["percentiles"]["p99"]}


RUNS = {"aiperf": aiperf, "guidellm": guidellm}


def peer_runs(url: str, rate: float, count: int, tokens: int, seed: int,
              tmp: Path) -> dict[str, dict]:
    """Each peer's TTFT p50 and p99 (ms, its own), at `rate` requests/s for
    `count` requests of `tokens` output tokens; or {"skipped": why}."""
    run = PeerRun(url, rate, count, tokens, seed, write_tokenizer(tmp / "peer-tokenizer"))
    rows = {}
    for name in PEERS:
        exe = find(name)
        if exe is None:
            rows[name] = {"skipped": f"{name} is not installed (make peers installs it)"}
            continue
        out = tmp / f"peer-{name}"
        out.mkdir()
        try:
            rows[name] = RUNS[name](exe, run, out)
        except subprocess.CalledProcessError as exc:
            tail = (exc.stderr or exc.stdout or b"").decode(errors="replace")[-300:]
            rows[name] = {"skipped": f"{name} failed (exit {exc.returncode}): {tail}"}
        except (subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
            rows[name] = {"skipped": f"{name} failed: {exc!r}"}
    return rows
