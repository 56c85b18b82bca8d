"""Load-test configuration: one frozen dataclass, validated once, errors naming the flag."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from loadgen.arrivals import ARRIVALS
from loadgen.profiles import Profile, read_trace
from loadgen.workload import DEFAULT_CLASSES, load_dataset, parse_classes

MODES = ("fixed", "stress", "mixed", "closed")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class LoadConfig:
    host: str = "127.0.0.1:50051"
    mode: str = "fixed"
    rate: float = 1.0  # offered requests/s, total
    arrival: str = "poisson"
    burstiness: float = 1.0  # gamma arrivals: shape; below 1 burstier than Poisson
    prompt_tokens: int = 64
    prompt_tokens_max: int = 0  # above 0: prompt lengths uniform in [prompt_tokens, prompt_tokens_max]
    max_tokens: int = 32
    warmup_s: float = 0.0
    seed: int = 0
    run_dir: str = ""
    request_timeout_s: float = 120.0
    max_in_flight: int = 1000
    drain_s: float = 30.0
    interval_s: float = 1.0  # interval histograms (.hlog) and GetStats samples
    client: str = "gevent"  # gevent: Locust's own greenlets; aio: a grpc.aio sender process
    max_request_rows: int = 100_000  # requests.jsonl holds the first this many requests
    rate_start: float = 0.0  # stress: the first step's rate; 0 = --rate
    rate_step: float = 0.0  # stress: added to the rate each step ...
    rate_mult: float = 0.0  # ... or the rate multiplied by this each step
    step_s: float = 10.0  # stress: length of a step
    max_steps: int = 20  # stress: give up finding saturation after this many
    saturation_share: float = 0.9  # stress: achieved below this share of offered = saturated
    classes: str = DEFAULT_CLASSES  # mixed: name:weight:prompt_tokens:max_tokens,...
    profile: str = ""  # mixed: sinusoid:..., bursts:... or trace:FILE; "" = constant rate
    dataset: str = ""  # a ShareGPT-style JSON file: prompts and output lengths come from it
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None

    def __post_init__(self):
        def check(ok: bool, flag: str, message: str):
            if not ok:
                raise ConfigError(f"--{flag}: {message}")

        check(self.mode in MODES, "mode", f"unknown {self.mode!r}; choose from {', '.join(MODES)}")
        check(self.rate > 0, "rate", f"must be above 0 requests/s, got {self.rate}")
        check(self.arrival in ARRIVALS, "arrival", f"unknown {self.arrival!r}; choose from {', '.join(ARRIVALS)}")
        check(self.burstiness > 0, "burstiness", f"must be above 0, got {self.burstiness}")
        check(self.prompt_tokens >= 1, "prompt-tokens", f"must be at least 1, got {self.prompt_tokens}")
        check(self.prompt_tokens_max == 0 or self.prompt_tokens_max >= self.prompt_tokens, "prompt-tokens-max",
              f"must be 0 (fixed length) or at least --prompt-tokens ({self.prompt_tokens}), "
              f"got {self.prompt_tokens_max}")
        check(self.max_tokens >= 1, "max-tokens", f"must be at least 1, got {self.max_tokens}")
        check(self.warmup_s >= 0, "warmup-s", f"must be at least 0, got {self.warmup_s}")
        check(self.request_timeout_s > 0, "request-timeout-s", f"must be above 0, got {self.request_timeout_s}")
        check(self.max_in_flight >= 1, "max-in-flight", f"must be at least 1, got {self.max_in_flight}")
        if self.mode == "stress":
            check(self.rate_step > 0 or self.rate_mult > 1, "rate-step",
                  "stress mode needs --rate-step above 0 or --rate-mult above 1 (the rate starts at --rate)")
            check(self.rate_start >= 0, "rate-start", f"must be at least 0 (0 = --rate), got {self.rate_start}")
            check(self.step_s > 0, "step-s", f"must be above 0, got {self.step_s}")
            check(self.max_steps >= 1, "max-steps", f"must be at least 1, got {self.max_steps}")
            check(0 < self.saturation_share <= 1, "saturation-share",
                  f"must be in (0, 1], got {self.saturation_share}")
        if self.mode == "mixed":
            try:
                parse_classes(self.classes)
            except ValueError as exc:
                check(False, "classes", str(exc))
            if self.profile:
                try:
                    profile = Profile.parse(self.profile)
                    if profile.kind == "trace":
                        read_trace(profile.path)
                except ValueError as exc:
                    check(False, "rate-profile", str(exc))
        check(not self.profile or self.mode == "mixed", "rate-profile", "is for --mode mixed")
        if self.dataset:
            try:
                load_dataset(self.dataset)
            except ValueError as exc:
                check(False, "dataset", str(exc))
        check(self.client in ("gevent", "aio"), "client", f"must be gevent or aio, got {self.client!r}")
        check(self.client == "gevent" or self.mode in ("fixed", "mixed"), "client",
              "aio sends open-loop schedules only: use it with --mode fixed or mixed")
        check(self.max_request_rows >= 0, "max-request-rows", f"must be at least 0, got {self.max_request_rows}")
        check(self.interval_s > 0, "interval-s", f"must be above 0, got {self.interval_s}")
        check(self.drain_s >= 0, "drain-s", f"must be at least 0, got {self.drain_s}")
        for flag, slo in (("slo-ttft-ms", self.slo_ttft_ms), ("slo-tpot-ms", self.slo_tpot_ms),
                          ("slo-e2e-ms", self.slo_e2e_ms)):
            check(slo is None or slo > 0, flag, f"must be above 0, got {slo}")
        check(self.host.rpartition(":")[2].isdigit(), "host", f"must be HOST:PORT, got {self.host!r}")

    def as_dict(self) -> dict:
        return asdict(self)
