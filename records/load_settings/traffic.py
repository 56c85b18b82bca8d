"""The offered load and the requests that make it."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import above, at_least, within
from records.declare import GIVEN, Names, Settings, require, setting
from records.load_settings.choices import (
    ARRIVALS,
    DEFAULT_CLASSES,
    MODES,
    ONE_SHAPE,
    OPEN_LOOP,
    OPEN_LOOP_MODES,
    RATED,
    SESSIONS,
    TRACE_FORMATS,
    TRACED,
)
from records.scenarios import scenario_problem


@dataclass(frozen=True)
class TrafficSettings(Settings):
    """Offered load"""

    mode: str = setting("fixed", "fixed: constant offered rate, open loop. stress: the rate starts "
                        "at --rate-start and rises by --rate-step (or times --rate-mult) every "
                        "--step-s until a step saturates (achieved below --saturation-share of "
                        "what was sent, an SLO broken at p99, or requests in flight growing "
                        "steadily), then the run stops by itself and reports the knee, the highest "
                        "rate that held; per-step results in steps.csv (one process only). mixed: "
                        "request classes drawn by weight (--classes), each reported on its own and "
                        "together, at a rate shaped by --rate-profile. closed: Locust's own model, "
                        "-u users each sending the next request when the last ends (it "
                        "under-states queueing, and the run says so). sessions: multi-turn "
                        "conversations arriving at --rate sessions/s, each turn re-sending the "
                        "history with the server's replies (--session-turns, --think-time-s). "
                        "sla: the highest rate holding the objectives (--slo-*-ms at "
                        "--slo-percentile), probe by probe, each judged by MLPerf's early-"
                        "stopping rule (distributed: the master decides, workers send); "
                        "docs/sla.md",
                        choices=MODES,
                        label="Mode")
    rate: float = setting(1.0, "offered requests/s (sessions/s in sessions mode), total across "
                          "users and workers",
                          check=above(0, " requests/s"),
                          label="Offered rate (requests/s)", when=RATED)
    arrival: str = setting("poisson", "gaps between sends: poisson (exponential), constant, or "
                           "gamma (see --burstiness)", choices=ARRIVALS,
                           label="Arrivals", when=OPEN_LOOP)
    burstiness: float = setting(1.0, "gamma arrivals: shape of the gap distribution (same mean); "
                                "below 1 burstier than Poisson, 1 is Poisson", check=above(0),
                                label="Gamma shape (burstiness)",
                                when={"mode": OPEN_LOOP_MODES, "arrival": "gamma"})
    profile: str = setting("", "mixed: sinusoid:PERIOD_S:AMPLITUDE, bursts:EVERY_S:LENGTH_S:FACTOR "
                           "(a Poisson process shaped by it), or trace:FILE (replay send times in "
                           "seconds, one per line); a constant rate when empty",
                           flag="rate-profile", choices=Names("profiles"),
                           label="Rate profile", when={"mode": "mixed"})
    trace: str = setting("", "replay a trace: each request at its time with its prompt and "
                         "output lengths (Mooncake JSONL, BurstGPT CSV, Azure LLM inference "
                         "CSV, or our JSONL: docs/workloads.md), instead of --rate and "
                         "--arrival; the run ends when the trace does", label="Trace to replay")
    trace_format: str = setting("auto", "--trace's format; auto: told from its first line",
                                choices=TRACE_FORMATS, label="Trace format", when=TRACED)
    trace_block_tokens: int = setting(512, "Mooncake traces: tokens a hash id stands for (the "
                                      "trace's block size)", check=at_least(1),
                                      label="Trace block tokens", when=TRACED)
    trace_speedup: float = setting(1.0, "trace send times divided by this", check=above(0),
                                   label="Trace speed-up", when=TRACED)
    trace_start_s: float = setting(0.0, "replay the trace from this time on", check=at_least(0),
                                   label="Trace start (s)", when=TRACED)
    trace_window_s: float = setting(0.0, "replay this many seconds of the trace (0: to its "
                                    "end)", check=at_least(0), label="Trace window (s; 0: all)",
                                    when=TRACED)
    trace_loop: bool = setting(False, "replay the trace (or its slice) again and again, for "
                               "soaks longer than it", label="Loop the trace", when=TRACED)
    session_turns: str = setting("4", "sessions: turns of each session, N or MIN-MAX (uniform, "
                                 "drawn per session); with --dataset a conversation's own "
                                 "turns, at most this many", choices=Names("turns"),
                                 label="Turns per session", when=SESSIONS)
    think_time_s: str = setting("1", "sessions: seconds from a reply's end to the next turn, N, "
                                "MIN-MAX (uniform) or exp:MEAN, drawn per turn",
                                choices=Names("think_times"), label="Think time (s)",
                                when=SESSIONS)
    seed: int = setting(0, "seed of the arrival schedule and prompts, so runs repeat",
                        label="Seed")
    scenario: str = setting("", "mlperf-server:MODEL: MLPerf Inference's server scenario for "
                            "the model (Poisson arrivals, its TTFT and TPOT bounds at p99, 600 "
                            "s and 100 queries at least); the report ends with PASS, FAIL or "
                            "NOT VALID and why (docs/sla.md)", check=scenario_problem,
                            compared=False, label="Scenario preset")
    scenario_quick: bool = setting(False, "with --scenario: 30 s suffice instead of 600 s, and "
                                   "the verdict says the run is not rule-conformant",
                                   compared=False, label="Quick scenario (not conformant)",
                                   when={"scenario": GIVEN})


@dataclass(frozen=True)
class WorkloadSettings(Settings):
    """Requests"""

    prompt_tokens: int = setting(64, "prompt length of each request, in tokens", check=at_least(1),
                                 label="Prompt tokens", when=ONE_SHAPE)
    prompt_tokens_max: int = setting(0, "above 0: prompt lengths uniform between --prompt-tokens "
                                     "and this", check=at_least(0),
                                     label="Prompt tokens, up to (0: all the same)", when=ONE_SHAPE)
    max_tokens: int = setting(32, "output tokens per request (exact where the target can ask "
                              "for it: docs/targets.md)", check=at_least(1),
                              label="Output tokens")
    classes: str = setting(DEFAULT_CLASSES, "mixed: request classes "
                           "name:weight:prompt_tokens:max_tokens, comma-separated",
                           choices=Names("classes"),
                           label="Request classes", when={"mode": "mixed", "dataset": ""})
    dataset: str = setting("", "a ShareGPT-style JSON file: each request is a conversation's first "
                           "human turn, its output length the reply's (capped by --max-tokens)",
                           choices=Names("datasets"),
                           label="Dataset (ShareGPT-style JSON)")
    shared_prefix_tokens: int = setting(0, "every request starts with one of --prefix-groups "
                                        "fixed prefixes of this many tokens (drawn by a seeded "
                                        "draw), then its own prompt: a fleet sharing a system "
                                        "prompt; 0: none", check=at_least(0),
                                        label="Shared prefix tokens (0: none)")
    prefix_groups: int = setting(1, "how many different shared prefixes "
                                 "(--shared-prefix-tokens)", check=at_least(1),
                                 label="Shared prefix groups")
    cancel_share: float = setting(0.0, "share of requests the client cancels part-way, after a "
                                  "random number of output tokens (1 to max_tokens - 1): counted "
                                  "as CLIENT_CANCELLED, neither ok nor failed (a soak checks that "
                                  "the server frees what they held)", check=within(0, 1),
                                  label="Share cancelled by the client")

    def __post_init__(self):
        super().__post_init__()
        require(self.prompt_tokens_max == 0 or self.prompt_tokens_max >= self.prompt_tokens,
                "prompt-tokens-max", f"must be 0 (fixed length) or at least --prompt-tokens "
                f"({self.prompt_tokens}), got {self.prompt_tokens_max}")
