"""Accounting and latency recording for one run, and the numbers of its summary.

Every request the schedule produced ends in exactly one bucket: not sent (the generator's
own in-flight limit), ok, or failed by status code. Requests scheduled during warm-up are
counted but kept out of latency and throughput.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from loadgen.client import StreamResult
from loadgen.histograms import Histogram
from loadgen.timing import StreamTiming, stream_timing

CLIENT_METRICS = ("ttft", "ttft_service", "tpot", "itl", "e2e", "e2e_service", "send_lag")
SERVER_METRICS = ("queue", "prefill", "decode", "ttft")
LATE_SEND_MS = 5.0  # a send this late means the generator, not the server, is the bottleneck
BUSY_CPU_PERCENT = 50.0  # past this, gevent grpc's delivery lag grows (NOTES.md): timing less exact


@dataclass
class Recorder:
    start_ns: int
    warmup_s: float
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    client: dict[str, Histogram] = field(default_factory=lambda: {m: Histogram() for m in CLIENT_METRICS})
    server: dict[str, Histogram] = field(default_factory=lambda: {m: Histogram() for m in SERVER_METRICS})
    results: list[StreamResult] = field(default_factory=list)
    timings: dict[str, StreamTiming] = field(default_factory=dict)  # measured ok requests by id
    not_sent: int = 0
    late_sends: int = 0

    @property
    def warmup_end_ns(self) -> int:
        return self.start_ns + int(self.warmup_s * 1e9)

    def is_warmup(self, result: StreamResult) -> bool:
        return result.scheduled_ns < self.warmup_end_ns

    def add(self, result: StreamResult) -> StreamTiming | None:
        """Accounts for a finished request; returns its timing when it is measured and ok."""
        self.results.append(result)
        if (result.sent_ns - result.scheduled_ns) / 1e6 > LATE_SEND_MS:
            self.late_sends += 1
        if self.is_warmup(result):
            return None
        self.client["send_lag"].record((result.sent_ns - result.scheduled_ns) // 1000)
        if not result.ok:
            return None
        t = stream_timing(result.scheduled_ns, result.sent_ns, result.recv_ns, result.tokens)
        self.timings[result.request_id] = t
        for name in ("ttft", "ttft_service", "e2e", "e2e_service"):
            self.client[name].record(getattr(t, f"{name}_us"))
        for itl in t.itl_us:
            self.client["itl"].record(itl)
        if t.tpot_us is not None:
            self.client["tpot"].record(t.tpot_us)
        for name in SERVER_METRICS:
            if f"{name}_us" in result.usage:
                self.server[name].record(result.usage[f"{name}_us"])
        return t

    def meets_slo(self, t: StreamTiming) -> bool:
        ttft_ok = self.slo_ttft_ms is None or t.ttft_us <= self.slo_ttft_ms * 1000
        tpot_ok = self.slo_tpot_ms is None or t.tpot_us is None or t.tpot_us <= self.slo_tpot_ms * 1000
        return ttft_ok and tpot_ok

    def accounting(self) -> dict:
        failed = Counter(r.status for r in self.results if not r.ok)
        ok = len(self.results) - sum(failed.values())
        return {"sent": len(self.results), "ok": ok, "failed": sum(failed.values()),
                "not_sent": self.not_sent, "failed_by_code": dict(sorted(failed.items())),
                "warmup": sum(self.is_warmup(r) for r in self.results)}

    def throughput(self, stop_ns: int) -> dict:
        """Rates over the measured window [end of warm-up, stop]: output tokens received in
        it, and measured ok requests (meeting the SLOs, for goodput) that completed in it."""
        lo, hi = self.warmup_end_ns, stop_ns
        window_s = max(hi - lo, 1) / 1e9
        tokens = sum(n for r in self.results for t, n in zip(r.recv_ns, r.tokens, strict=True) if lo <= t <= hi)
        done = [r for r in self.results if r.request_id in self.timings and r.recv_ns[-1] <= hi]
        good = [r for r in done if self.meets_slo(self.timings[r.request_id])]
        return {"window_s": window_s, "output_tokens_per_s": tokens / window_s,
                "requests_per_s": len(done) / window_s, "goodput_requests_per_s": len(good) / window_s}

    def generator_health(self, cpu_percent: float) -> dict:
        lag = self.client["send_lag"].summary_ms()
        warnings = []
        if cpu_percent > BUSY_CPU_PERCENT:
            warnings.append(f"the load generator used {cpu_percent:.0f}% of a core; above {BUSY_CPU_PERCENT:g}% its "
                            "receive timestamps lag (tens of ms at p99): lower the rate or add processes")
        if self.late_sends:
            warnings.append(
                f"{self.late_sends} of {len(self.results)} requests were sent more than "
                f"{LATE_SEND_MS:g} ms after their scheduled time (send lag p99 {lag.get('p99', 0):.1f} ms, "
                f"max {lag.get('max', 0):.1f} ms): "
                "the load generator could not keep up; latencies still count from the schedule, "
                "but lower the rate or add processes to measure the server alone")
        if self.not_sent:
            warnings.append(f"{self.not_sent} scheduled requests were not sent: {self.not_sent} over "
                            "--max-in-flight; the server is not keeping up with the offered rate")
        clamped = sum(h.clamped for h in self.client.values())
        if clamped:
            warnings.append(f"{clamped} latency values fell outside the histogram range and were clamped")
        return {"late_sends": self.late_sends, "late_threshold_ms": LATE_SEND_MS, "cpu_percent": cpu_percent,
                "warnings": warnings}
