"""The engine thread: runs the batching loop (server/scheduling/batching_loop.py) a step at a
time, its plan and apply under one lock, the engine step outside it. Front ends submit, cancel
and read stats through it from the event loop. Sinks are called on this thread; admission
(server/frontends/admission.py) makes them thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from records.engine_telemetry import Count
from server.errors import QueueFullError, ShutdownError, StepOutOfMemory, UnavailableError
from server.scheduling.batching_loop import BatchingLoop
from server.scheduling.faults import InjectedFault
from server.scheduling.heap import HeapTrimmer
from server.scheduling.policies import StepPlan
from server.scheduling.requests import Request
from server.telemetry.process import GpuStats, gpu_stats
from server.telemetry.readings import Now, readings

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30  # a step that takes longer at shutdown is hung (a stuck device)


# Out of memory where a library, not torch's allocator, failed to allocate: raised as a plain
# RuntimeError (cuBLAS's workspace, a CUDA call's own buffers)
OUT_OF_MEMORY_MESSAGES = ("CUBLAS_STATUS_ALLOC_FAILED", "CUDA error: out of memory")


def out_of_memory(exc: RuntimeError) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or any(
        m in str(exc) for m in OUT_OF_MEMORY_MESSAGES)


class EngineThread:
    def __init__(self, batching: BatchingLoop, heap: HeapTrimmer,
                 on_failure: Callable[[], None] = lambda: None):
        """batching: the loop this thread runs, built with its faults (app.start builds it);
        heap: returns freed memory between steps; on_failure: called on this thread if a step
        raises."""
        self.batching = batching
        self.engine, self.policy = batching.engine, batching.policy
        if batching.faults is None:
            raise ValueError("the engine thread reports its batching loop's faults: build the "
                             "loop with an Injector")
        self.faults = batching.faults
        self.heap = heap
        self.on_failure = on_failure
        self.started_ns = time.monotonic_ns()
        self.before = self.batching.new_telemetry()  # the windows ResetStats ended, added up
        self._cond = threading.Condition()
        self._stopping = False
        self._failure: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, reason: str) -> None:
        """Stops the engine thread and ends every unfinished request (ShutdownError)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("engine step still running after %d s; shutting down without it",
                      STOP_TIMEOUT_S)
        with self._cond:
            self.batching.fail_all(ShutdownError(reason))
        if self.batching.step_log is not None:
            self.batching.step_log.close()

    @property
    def running(self) -> bool:
        """Neither stopping nor failed."""
        return not self._stopping and self._failure is None

    def submit(self, req: Request) -> None:
        with self._cond:
            if self._stopping or self._failure is not None:
                raise UnavailableError(f"the engine is not running ({self._failure or 'stopping'})")
            try:
                self.batching.enqueue(req)
            except QueueFullError as exc:
                exc.retry_after_s = self.batching.retry_after_s()
                raise
            self._cond.notify()

    def retry_after_s(self) -> float:
        with self._cond:
            return self.batching.retry_after_s()

    def cancel(self, req: Request) -> None:
        """Frees the request's queue place or KV slot before the next step."""
        with self._cond:
            self.batching.cancel(req)
            self._cond.notify()

    def record_write(self, ms: float) -> None:
        """One streamed message's write delay (stamped -> the transport took it). Called on the
        event loop for every message, so it does not wait for the engine thread's lock: a
        histogram update is a few attribute writes, and GetStats reads on the same loop."""
        self.batching.telemetry.histograms["write_ms"].record(ms)

    def count_rejected(self) -> None:
        with self._cond:
            self.batching.telemetry.counts[Count.REQUESTS_REJECTED] += 1

    def readings(self) -> dict[str, object]:
        """Every declared metric over the GetStats window (server/telemetry/readings.py)."""
        gpu = gpu_stats(self.engine.device)  # NVML's answer, outside the lock
        with self._cond:
            telemetry = self.batching.telemetry.snapshot()
            now = self._now(gpu)
        return readings(telemetry, telemetry.cache_counters(self.batching.cache_counters()), now)

    def lifetime_readings(self) -> dict[str, object]:
        """Every declared metric since the server started, ResetStats or not (/metrics): the
        expert caches' own counters, the windows ResetStats ended added up."""
        gpu = gpu_stats(self.engine.device)
        with self._cond:
            telemetry = self.before.plus(self.batching.telemetry)
            now = self._now(gpu)
        return readings(telemetry, self.batching.cache_counters(), now)

    def _now(self, gpu: GpuStats) -> Now:
        """Under the lock: the queue as the engine thread sees it."""
        b, engine = self.batching, self.engine
        return Now(running=len(b.resident), waiting=len(b.waiting),
                   kv_slots_in_use=engine.kv_slots - len(engine.slots),
                   kv_slots_total=engine.kv_slots,
                   prefix_cache_blocks=b.prefix_cache.blocks if b.prefix_cache else 0,
                   uptime_s=(time.monotonic_ns() - self.started_ns) / 1e9,
                   gpu=gpu, heap_trims=self.heap.trims,
                   heap_trim_ms=self.heap.trim_ms, faults=self.faults.snapshot())

    def reset_stats(self) -> None:
        """A new GetStats window; the lifetime figures (/metrics) keep the old one's."""
        with self._cond:
            self.before = self.before.plus(self.batching.telemetry)
            self.batching.telemetry = self.batching.new_telemetry()

    def _out_of_memory(self, plan: StepPlan, exc: RuntimeError) -> None:
        prompt = sum(n for _, n in plan.prefill)
        ran = len(plan.prefill) + len(plan.decode)
        log.warning("engine step out of memory (%d sequences, %d prompt tokens); failing them "
                    "and serving on: %s", ran, prompt, str(exc).splitlines()[0])
        if self.batching.engine.device.type == "cuda":
            torch.cuda.empty_cache()  # what the failed step's tensors held goes back
        with self._cond:
            self.batching.fail_plan(plan, StepOutOfMemory(
                f"the engine ran out of memory in a step of {ran} sequences ({prompt} prompt "
                "tokens); this request failed and its KV slot is free; retry, or run the server "
                "with a smaller --max-prefill-tokens or --max-batch-size"))

    def _run(self) -> None:
        b = self.batching
        device = b.engine.device
        if device.type == "cuda":  # kernels, events and allocations of this thread go there
            torch.cuda.set_device(device)
        try:
            while True:
                with self._cond:
                    while b.idle and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        return
                    plan = b.plan()
                    if not plan:  # the policy waits for a batch to fill, or for a slot
                        self._cond.wait(timeout=plan.wake_in_s)
                        continue
                try:
                    result, t0, t1 = b.run(plan)
                except InjectedFault as fault:
                    with self._cond:
                        b.fail_plan(plan, fault)
                    continue
                except RuntimeError as exc:  # out of memory: this step's requests, not the server
                    if not out_of_memory(exc):
                        raise
                    self._out_of_memory(plan, exc)
                    continue
                with self._cond:
                    b.apply(plan, result, t0, t1)
                self.heap.maybe_trim()
        except Exception as exc:  # the engine is broken: no request may hang on it
            log.exception("engine step failed; failing all requests")
            with self._cond:
                self._failure = exc
                b.fail_all(exc)
            self.on_failure()
