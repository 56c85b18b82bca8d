"""The diagnosis rule on the engine itself: a GPU that waits for the host most of a step (the
host launching kernels from Python slower than the GPU runs them), read from the server's own
GPU busy counters (docs/metrics.md, "Stage times and GPU busy")."""

from __future__ import annotations

from analysis.readers.server_stats import server_view
from analysis.rules.finding import Finding
from analysis.rules.spikes import Signals

# The GPU busy under half of a step: it waits for the host most of the step, so a faster GPU,
# a better batching policy or more load buys little until the launches go (CUDA graphs, fewer
# kernels a layer, a larger batch per launch).
BUSY_SHARE = 0.5
MIN_TIMED_STEPS = 5  # fewer steps timed than this judge nothing


def host_bound(d: Signals) -> Finding:
    rule = ("host_bound", "Host-bound engine (the GPU waits for the host)")
    view = server_view(d.run.summary.server)
    if view is None:
        return Finding(*rule, False, "summary.json has no server GetStats snapshots", [],
                       judged=False)
    counters = view.counters
    steps = int(counters.get("gpu_timed_steps", 0))
    if steps < MIN_TIMED_STEPS:
        where = f"on {view.device}" if view.device else "on an unknown device"
        return Finding(*rule, False, f"{steps} engine steps were timed for GPU busy (need "
                       f"{MIN_TIMED_STEPS}); the server ran {where}: a CPU does its own work, "
                       "and a GPU server before this counter reports none", [], judged=False)
    busy, timed = counters["gpu_busy_ms"], counters["gpu_timed_ms"]
    share = busy / timed if timed else 0.0
    evidence = [f"GPU busy {busy:.0f} ms of {timed:.0f} ms over {steps} timed steps "
                f"({share:.1%}; threshold {BUSY_SHARE:.0%})",
                f"per timed step: GPU work {busy / steps:.2f} ms, step {timed / steps:.2f} ms"]
    settings = d.run.summary.server.latest.reported_settings()
    if "cuda_graphs" in settings:
        evidence.append(f"cuda_graphs {settings['cuda_graphs']}, moe_kernel "
                        f"{settings.get('moe_kernel', '?')} (the server's log says why a step "
                        "could not be captured)")
    if share >= BUSY_SHARE:
        return Finding(*rule, False, f"The GPU was busy {share:.0%} of each timed step "
                       f"(threshold {BUSY_SHARE:.0%}): the host keeps it fed.", evidence)
    return Finding(*rule, True, f"The engine is host-bound: the GPU was busy {share:.0%} of each "
                   "timed step and waited for the host to launch its kernels the rest, so step "
                   "time measures Python and launch overhead, not the model or the batching "
                   "policy. Decode steps as CUDA graphs (--cuda-graphs), fewer kernels a layer "
                   "or a larger batch per launch would feed it.", evidence)
