"""`python -m server.tools.gpu_bench` (`make gpu-bench`): the GPU path in one prepared run, for a
machine whose time is short and counted (docs/measured.md, "On a GPU").

1. gpu-check's parts but Mixtral's build (server/tools/gpu_check.py): the build, host reads per
   step, the MoE kernels side by side, fused attention, the tests marked gpu.
2. A decode sweep per preset and batch: the step's median time with decode graphs and eagerly,
   against its bandwidth bound: the bytes the step must read (the non-expert weights, the experts
   its own routing touched, the KV its sequences attend to) over the rate a device-to-device
   copy reached (reads and writes counted).
3. A profile of a few decode steps of the first preset, graphs on and off: kernel and graph
   launches per step, and the share of the steps' wall time the GPU ran kernels.
4. End to end, the project's own server and Locust client on the first preset: a stress run for
   the knee under fcfs, then each batching policy at --e2e-load of it, compared
   (`python -m analysis compare`), with the GPU utilisation NVML reported.

Writes gpu_bench.json (every number), gpu_bench.md (the tables) and compare.md into --out, and
prints the tables, then one line of JSON. On a machine without CUDA the same run works on the CPU
with small presets (`--presets tiny`), so it is tested there. Timings are information, never
asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from records.cli import Parser
from server.engine.interface import SeqInput
from server.engine.local import LocalEngine, indexed
from server.engine.model_args import PRESETS
from server.scheduling.policies import POLICIES
from server.settings import device_problem
from server.tools import gpu_check
from server.tools.gpu_check import sync

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
COPY_BYTES = 2 * 2**30  # the copy that measures the rate: far past any cache
PROMPT = 256  # tokens each sequence of the sweep holds before its decode steps
CONTEXT = 1024  # the sweep's context, so a 64-sequence pool of Mixtral fits beside its weights
TIMED_STEPS = 10
PROFILED_STEPS = 3
# Each run's size on a GPU, and the small one that runs on a CPU (tests/test_gpu_bench.py)
DEFAULTS = {
    "cuda": {"presets": "olmoe-1b-7b,qwen3-30b-a3b,mixtral-8x7b", "batches": "1,8,32,64",
             "copy_mb": COPY_BYTES // 2**20, "e2e_batch": 64, "e2e_run_s": 20, "e2e_warmup_s": 4,
             "stress_start": 4.0, "stress_step_s": 8, "stress_steps": 9, "prompt_min": 128,
             "prompt_max": 512, "output_tokens": 128},
    "cpu": {"presets": "tiny,fine", "batches": "1,8", "copy_mb": 256, "e2e_batch": 8,
            "e2e_run_s": 6, "e2e_warmup_s": 1, "stress_start": 4.0, "stress_step_s": 3,
            "stress_steps": 3, "prompt_min": 8, "prompt_max": 32, "output_tokens": 8},
}
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cudaGraphLaunch",
            "cuGraphLaunch")


def copy_rate(device: torch.device, nbytes: int) -> float:
    """Bytes a second a device-to-device copy moves, its reads and writes both counted (median
    of five copies of nbytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    spans = []
    for _ in range(5):
        sync(device)
        start = time.perf_counter_ns()
        dst.copy_(src)
        sync(device)
        spans.append((time.perf_counter_ns() - start) / 1e9)
    return 2 * nbytes / statistics.median(spans)


def bench_args(preset: str):
    """The preset's shapes with its context cut to CONTEXT."""
    return dataclasses.replace(PRESETS[preset], max_seq_len=min(CONTEXT,
                                                                PRESETS[preset].max_seq_len))


def weight_bytes(engine: LocalEngine) -> tuple[int, int]:
    """(bytes of the weights every decode step reads whole, bytes of one expert): the embedding
    table is left out (a step reads one row per token), an untied output projection is in."""
    tied = engine.args.tie_embeddings
    dense = sum(p.numel() * p.element_size() for name, p in engine.model.named_parameters()
                if ".moe.experts." not in name and (tied or "tok_embeddings" not in name))
    return dense, engine.expert_bytes


def kv_bytes(engine: LocalEngine, positions: int) -> int:
    """KV bytes read attending to this many cached positions, every layer."""
    a = engine.args
    return positions * a.n_layers * 2 * a.n_kv_heads * a.head_dim * engine.dtype.itemsize


def prompt_tokens(engine: LocalEngine) -> int:
    """What each sequence holds before its timed decode steps: PROMPT, or half the context."""
    return min(PROMPT, engine.args.max_seq_len // 2)


def decode_times(engine: LocalEngine, batch: int, graphs: bool) -> tuple[float, list]:
    """Median ms of TIMED_STEPS decode steps of `batch` sequences (after 2 untimed), graphs on
    or off, and the timed steps' results; the sequences are prefilled first."""
    saved = engine.graphs
    engine.graphs = saved if graphs else None
    prompt = prompt_tokens(engine)
    try:
        engine.step([SeqInput(i, [1 + i % 7] * prompt, 0) for i in range(batch)])
        spans, results = [], []
        for step in range(2 + TIMED_STEPS):
            seqs = [SeqInput(i, [2 + step % 5], prompt + step) for i in range(batch)]
            sync(engine.device)
            start = time.perf_counter_ns()
            result = engine.step(seqs)
            sync(engine.device)
            if step >= 2:
                spans.append((time.perf_counter_ns() - start) / 1e6)
                results.append(result)
    finally:
        engine.graphs = saved
    return statistics.median(spans), results


def sweep_preset(preset: str, batches: list[int], device: torch.device, dtype: torch.dtype,
                 rate: float) -> list[dict]:
    """One row per batch: the decode step with graphs and eagerly, against its bound."""
    args = bench_args(preset)
    built = time.perf_counter()
    engine = LocalEngine(args, max(batches), str(device), dtype, 0)
    build_s = time.perf_counter() - built
    dense, expert = weight_bytes(engine)
    rows = []
    for batch in batches:
        row = {"preset": preset, "batch": batch, "graphs": engine.graphs is not None,
               "build_s": round(build_s, 1), "kernel": engine.kernel_name}
        for mode in ("graphs", "eager"):
            if mode == "graphs" and engine.graphs is None:
                continue
            ms, results = decode_times(engine, batch, mode == "graphs")
            touched = statistics.median(sum(r.active) for r in results)
            kv = statistics.median(kv_bytes(engine, r.kv_useful) for r in results)
            bound_ms = (dense + touched * expert + kv) / rate * 1e3
            row |= {f"{mode}_ms": ms, "bound_ms": bound_ms, "touched_pairs": touched,
                    f"{mode}_over_bound": ms / bound_ms}
        rows.append(row)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def profile(preset: str, batch: int, device: torch.device, dtype: torch.dtype) -> dict:
    """Per decode step, graphs on and off: launches (kernels, graphs), GPU kernel time and the
    share of the wall time it covers (on a CPU: aten operations dispatched)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args = bench_args(preset)
    engine = LocalEngine(args, batch, str(device), dtype, 0)
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
    out = {}
    for mode in ("graphs", "eager"):
        if mode == "graphs" and engine.graphs is None:
            continue
        saved = engine.graphs
        engine.graphs = saved if mode == "graphs" else None
        prompt = prompt_tokens(engine)
        engine.step([SeqInput(i, [3] * prompt, 0) for i in range(batch)])
        engine.step([SeqInput(i, [4], prompt) for i in range(batch)])
        sync(device)
        with torch_profile(activities=activities) as prof:
            start = time.perf_counter_ns()
            for step in range(PROFILED_STEPS):
                engine.step([SeqInput(i, [4], prompt + 1 + step) for i in range(batch)])
            sync(device)
            wall_ms = (time.perf_counter_ns() - start) / 1e6
        engine.graphs = saved
        averages = prof.key_averages()
        launches = sum(e.count for e in averages if e.key in LAUNCHES)
        kernel_us = sum(getattr(e, "self_device_time_total", 0) for e in averages
                        if str(getattr(e, "device_type", "")).endswith("CUDA"))
        aten = sum(e.count for e in averages if e.key.startswith("aten::"))
        out[mode] = {"launches_per_step": launches / PROFILED_STEPS,
                     "aten_ops_per_step": aten / PROFILED_STEPS,
                     "gpu_kernel_ms_per_step": kernel_us / 1e3 / PROFILED_STEPS,
                     "wall_ms_per_step": wall_ms / PROFILED_STEPS,
                     "gpu_busy_share": kernel_us / 1e3 / wall_ms if device.type == "cuda"
                     else None}
    return {"preset": preset, "batch": batch, **out}


class Server:
    """`python -m server` on a free port, started and stopped here (its log kept)."""

    def __init__(self, flags: list[str], tmp: Path, name: str):
        self.port_file, self.log = tmp / f"{name}.port", tmp / f"{name}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "server", *flags, "--port", "0",
                                      "--port-file", str(self.port_file)], cwd=REPO,
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not (self.port_file.exists() and self.port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the server did not start:\n{self.tail()}")
            time.sleep(0.2)
        self.host = f"127.0.0.1:{self.port_file.read_text().strip()}"

    def tail(self) -> str:
        return self.log.read_text()[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def locust(host: str, run_dir: Path, flags: list[str], limit_s: float) -> dict:
    """One headless run of the project's Locust client; its summary.json."""
    done = subprocess.run([sys.executable, "-m", "locust", "-f", "loadgen/moe.py", "--headless",
                           "--only-summary", "--host", host, "--run-dir", str(run_dir), *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=limit_s)
    summary = run_dir / "summary.json"
    if not summary.exists():
        raise RuntimeError(f"the run wrote no summary:\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(summary.read_text())


def nvml_utilisation(run_dir: Path) -> float | None:
    """Mean GPU utilisation (%) the server reported over the run's samples, None without."""
    path = run_dir / "server_stats.jsonl"
    values = [line["stats"].get("gpu_utilization_percent", -1) for line in
              map(json.loads, path.read_text().splitlines()) if "stats" in line] \
        if path.exists() else []
    values = [v for v in values if v is not None and v >= 0]
    return statistics.fmean(values) if values else None


def end_to_end(preset: str, device: str, policies: list[str], options: argparse.Namespace,
               out: Path) -> dict:
    """The knee under fcfs (a stress run), then each policy at options.e2e_load of it."""
    server_flags = ["--preset", preset, "--device", device, "--max-batch-size",
                    str(options.e2e_batch), "--max-seq-len", str(CONTEXT)]
    load = ["--prompt-tokens", str(options.prompt_min), "--prompt-tokens-max",
            str(options.prompt_max), "--max-tokens", str(options.output_tokens), "--seed", "1",
            "--interval-s", "1"]
    result = {"preset": preset, "server": server_flags, "load": load, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = Server([*server_flags, "--policy", "fcfs"], tmp, "stress")
        stress_s = options.stress_step_s * options.stress_steps
        try:
            stress = locust(server.host, tmp / "stress", [
                *load, "--mode", "stress", "--rate-start", str(options.stress_start),
                "--rate-mult", "1.5", "--step-s", str(options.stress_step_s), "--max-steps",
                str(options.stress_steps), "-t", f"{stress_s}s"], stress_s + 300)
        finally:
            server.stop()
        knee = (stress.get("stress") or {}).get("knee_rps")
        result["stress"] = {"knee_rps": knee,
                            "stopped_because": (stress.get("stress") or {}).get("stopped_because"),
                            "gpu_utilisation_percent": nvml_utilisation(tmp / "stress")}
        if not knee:
            return result
        rate = round(options.e2e_load * knee, 2)
        result["rate"] = rate
        dirs = []
        for policy in policies:
            server = Server([*server_flags, "--policy", policy], tmp, policy)
            try:
                summary = locust(server.host, tmp / policy, [
                    *load, "--rate", str(rate), "-t", f"{options.e2e_run_s}s", "--warmup-s",
                    str(options.e2e_warmup_s)], options.e2e_run_s + 300)
            finally:
                server.stop()
            metrics, requests = summary["metrics"], summary["requests"]
            result["runs"][policy] = {  # a run that measured nothing has no percentiles
                **{f"{m}_{p}_ms": metrics[f"{m}_ms"].get(p) for m in ("ttft", "tpot")
                   for p in ("p50", "p99")},
                "output_tokens_per_s": summary["throughput"]["output_tokens_per_s"],
                "ok": requests["ok"], "failed": requests["failed"],
                "gpu_utilisation_percent": nvml_utilisation(tmp / policy)}
            dirs.append(str(tmp / policy))
        compared = subprocess.run([sys.executable, "-m", "analysis", "compare", *dirs], cwd=REPO,
                                  capture_output=True, text=True, timeout=300)
        (out / "compare.md").write_text(compared.stdout + compared.stderr)
    return result


def table(headers: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else "-" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join([*lines, *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)])


def render(results: dict) -> str:
    parts = [f"{results['device']}; copy rate {results['copy_gb_s']:.0f} GB/s (reads and writes)"]
    if check := results.get("check"):
        parts += ["## Check (gpu-check's parts)",
                  table(["decode step", "host reads", "budget", "CUDA waits", "waited at"],
                        [[name, r.get("counted"), r.get("budget"), r.get("cuda_syncs"),
                          ", ".join(r.get("waited_at") or []) or r.get("skipped")]
                         for name, r in check["host_transfers"].items()]),
                  f"fused attention: {check['fused_attention']}; tests marked gpu: "
                  f"{check['gpu_tests']}"]
    parts += ["## Decode sweep",
             table(["preset", "batch", "graphs ms", "eager ms", "bound ms", "graphs / bound",
                    "eager / bound", "(layer, expert) pairs touched", "kernel"],
                   [[r["preset"], r["batch"], r.get("graphs_ms"), r.get("eager_ms"),
                     r.get("bound_ms"), r.get("graphs_over_bound"), r.get("eager_over_bound"),
                     r.get("touched_pairs"), r["kernel"]] for r in results["sweep"]])]
    if prof := results.get("profile"):
        parts += [f"## Profile: {prof['preset']}, batch {prof['batch']}, per decode step",
                  table(["mode", "launches", "aten ops", "GPU kernel ms", "wall ms", "GPU busy"],
                        [[mode, p["launches_per_step"], p["aten_ops_per_step"],
                          p["gpu_kernel_ms_per_step"], p["wall_ms_per_step"], p["gpu_busy_share"]]
                         for mode, p in prof.items() if isinstance(p, dict)])]
    if e2e := results.get("end_to_end"):
        stress = e2e.get("stress", {})
        parts += [f"## End to end: {e2e['preset']}, knee {stress.get('knee_rps')} requests/s "
                  f"({stress.get('stopped_because')}; NVML {stress.get('gpu_utilisation_percent')}"
                  f"%), each policy at {e2e.get('rate')} requests/s",
                  table(["policy", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "tokens/s",
                         "ok", "failed", "NVML %"],
                        [[policy, r["ttft_p50_ms"], r["ttft_p99_ms"], r["tpot_p50_ms"],
                          r["tpot_p99_ms"], r["output_tokens_per_s"], r["ok"], r["failed"],
                          r["gpu_utilisation_percent"]] for policy, r in e2e["runs"].items()])]
    return "\n\n".join(parts)


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, each default filled for the device (CUDA's or a CPU's); a flag that
    cannot be used ends the process, naming it."""
    p = Parser(prog="python -m server.tools.gpu_bench",
                                description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="runs/gpu-bench", help="folder for the files it writes")
    p.add_argument("--presets", help="the sweep's presets; the first is profiled and served end "
                   "to end (default: olmoe-1b-7b,qwen3-30b-a3b,mixtral-8x7b on CUDA, tiny,fine on "
                   "a CPU)")
    p.add_argument("--batches", help="decode batches (default 1,8,32,64; 1,8 on a CPU)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--skip", default="", help="parts to leave out: check,sweep,profile,e2e")
    p.add_argument("--copy-mb", type=int, help="the copy measuring the rate (default 2048; 256 "
                   "on a CPU)")
    p.add_argument("--e2e-load", type=float, default=0.75, help="each policy's rate / the knee")
    for name, help in (("e2e-batch", "the server's --max-batch-size"),
                       ("e2e-run-s", "seconds each policy runs"),
                       ("e2e-warmup-s", "warm-up seconds of each policy's run"),
                       ("stress-start", "requests/s of the stress run's first step (x1.5 a step)"),
                       ("stress-step-s", "seconds a stress step"),
                       ("stress-steps", "most stress steps"),
                       ("prompt-min", "prompt tokens, least"), ("prompt-max", "... and most"),
                       ("output-tokens", "output tokens a request")):
        p.add_argument(f"--{name}", type=float if name == "stress-start" else int,
                       help=f"{help} (default {DEFAULTS['cuda'][name.replace('-', '_')]}; "
                       f"{DEFAULTS['cpu'][name.replace('-', '_')]} on a CPU)")
    options = p.parse_args(argv)
    if problem := device_problem(options.device):
        p.error(f"--device: {problem}")
    for name, value in DEFAULTS["cuda" if options.device.startswith("cuda") else "cpu"].items():
        if getattr(options, name) is None:
            setattr(options, name, value)
    unknown = [n for n in options.presets.split(",") if n not in PRESETS]
    if unknown:
        p.error(f"--presets: unknown {', '.join(unknown)}; choose from {', '.join(PRESETS)}")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    device = indexed(torch.device(options.device))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    presets, skip = options.presets.split(","), set(filter(None, options.skip.split(",")))
    batches = [int(b) for b in options.batches.split(",")]
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": gpu_check.build(device),
                     "copy_gb_s": copy_rate(device, options.copy_mb * 2**20) / GB}
    if "check" not in skip:
        results["check"] = {"host_transfers": gpu_check.host_transfers(device, dtype),
                            "fused_attention": gpu_check.fused_attention(device),
                            "gpu_tests": gpu_check.gpu_tests() if device.type == "cuda"
                            else {"skipped": "CUDA only"}}
    results["sweep"] = [] if "sweep" in skip else [
        row for preset in presets
        for row in sweep_preset(preset, batches, device, dtype, results["copy_gb_s"] * GB)]
    if "profile" not in skip:
        results["profile"] = profile(presets[0], max(batches), device, dtype)
    if "e2e" not in skip:
        results["end_to_end"] = end_to_end(presets[0], options.device,
                                           options.policies.split(","), options, out)
    text = render(results)
    (out / "gpu_bench.md").write_text(text + "\n")
    (out / "gpu_bench.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(text)
    print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
