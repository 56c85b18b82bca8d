"""The load generator's settings (`locust -f loadgen/moe.py`), declared once: Locust's options,
the checks, summary.json's `config` and the comparison's workload warnings come from here
(records/declare.py). The formats the load generator parses itself (request classes, rate
profiles, datasets) are checked by it (loadgen/settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from records.declare import (
    GIVEN,
    Names,
    Settings,
    above,
    at_least,
    group,
    host_port,
    name_value,
    open_percentile,
    require,
    setting,
    url_path,
    urls_or_off,
    within,
)
from records.routing import moe_shape_problem
from records.scenarios import scenario_problem

MODES = ("fixed", "stress", "mixed", "closed", "sessions", "sla")
ARRIVALS = ("poisson", "constant", "gamma")
CLIENTS = ("auto", "gevent", "aio")
AIO_MODES = ("fixed", "mixed")  # the schedules the aio sender sends
TRACE_FORMATS = ("auto", "mooncake", "burstgpt", "azure", "jsonl")
DEFAULT_CLASSES = "chat:6:64:32,summarise:2:512:32,generate:2:32:128"
# Where settings apply (their `when`): the web UI's form hides the others, reports leave them out.
OPEN_LOOP_MODES = ("fixed", "stress", "mixed", "sessions", "sla")
OPEN_LOOP = {"mode": OPEN_LOOP_MODES}
# not classes, not a dataset
ONE_SHAPE = {"mode": ("fixed", "stress", "closed", "sessions"), "dataset": ""}
STRESS = {"mode": "stress"}
SLA = {"mode": "sla"}
SESSIONS = {"mode": "sessions"}
OPENAI = {"target": "openai"}
TRITON = {"target": "triton"}
TRACED = {"trace": GIVEN}  # a trace's options: only with --trace


@dataclass(frozen=True)
class TargetSettings(Settings):
    """Target"""

    target: str = setting("moe", "the server's protocol (docs/targets.md)",
                          choices=Names("targets"),
                          label="Server protocol")
    endpoint: str = setting("/v1/completions", "openai: /v1/completions or /v1/chat/completions",
                            check=url_path, compared=False,
                            label="OpenAI endpoint path", when=OPENAI)
    model: str = setting("", "openai: the model to ask for (default: the first /v1/models "
                         "lists); triton: the model to call", compared=False,
                         label="Model name", when={"target": ("openai", "triton")})
    api_key: str = setting("", "openai: sent as a bearer token (default: $OPENAI_API_KEY)",
                           compared=False, secret=True,
                           label="OpenAI API key", when=OPENAI)
    headers: tuple[str, ...] = setting((), "openai: an extra HTTP header NAME:VALUE",
                                       flag="header", check=name_value, compared=False, secret=True,
                                       label="Extra HTTP header (NAME:VALUE)", when=OPENAI)
    exact_length: bool = setting(True, "openai: ask for exactly --max-tokens output tokens with "
                                 "ignore_eos and min_tokens (vLLM, SGLang and this project's "
                                 "server take them); --no-exact-length for servers that refuse "
                                 "fields they do not know",
                                 label="Ask for exactly the output tokens", when=OPENAI)
    token_ids: bool | None = setting(None, "openai: ask for each chunk's token ids "
                                     "(return_token_ids: vLLM 0.10.2+ and this project's "
                                     "server), so output tokens are counted exactly without "
                                     "--tokenizer; default: where /v1/models names either",
                                     compared=False, label="Ask for token ids", when=OPENAI)
    routed_experts: str = setting("off", "openai: the experts the server's router chose for each "
                                  "request, into routed_experts.jsonl (docs/targets.md). on: "
                                  "ask (SGLang's return_routed_experts; vLLM sends them when "
                                  "started with --enable-return-routed-experts) and warn where "
                                  "replies lack them; auto: ask where /v1/models names vLLM, "
                                  "SGLang or this project's servers",
                                  choices=("off", "on", "auto"), compared=False,
                                  label="Routed experts", when=OPENAI)
    routed_experts_sample: float = setting(
        0.1, "openai, with --routed-experts: the share of requests sent non-streamed, whose "
        "replies carry the routed experts where vLLM's and this project's do (streamed ones "
        "never do); their TTFT, TPOT and ITL are not measured. 1: every request",
        check=within(0, 1), label="Routed experts: share not streamed", when=OPENAI)
    moe_shape: str = setting("", "the model's LAYERSxEXPERTSxTOP_K (48x128x8): needed to read "
                             "SGLang's flat routed-expert ids; vLLM's layers, top-k and ids "
                             "are checked against it",
                             check=moe_shape_problem, compared=False,
                             label="MoE shape (layers x experts x top-k)", when=OPENAI)
    tokenizer: str = setting("", "a Hugging Face tokenizer.json that counts the output tokens of "
                             "targets that stream text (openai; triton's trtllm backend); "
                             "without it they are estimated and the run says how",
                             compared=False,
                             label="Tokenizer file (tokenizer.json)",
                             when={"target": ("openai", "triton")})
    triton_backend: str = setting("vllm", "triton: the model's request shape, vllm (the vLLM "
                                  "backend) or trtllm (TensorRT-LLM's ensemble or BLS model)",
                                  choices=("vllm", "trtllm"), compared=False,
                                  label="Triton backend", when=TRITON)
    triton_input: str = setting("text_input", "triton: the prompt's input tensor",
                                compared=False,
                                label="Triton input tensor", when=TRITON)
    triton_output: str = setting("text_output", "triton: the generated text's output tensor",
                                 compared=False,
                                 label="Triton output tensor", when=TRITON)
    tls: bool = setting(False, "connect over TLS, trusting the system's CAs unless --tls-ca "
                        "(implied by --tls-ca and --tls-client-cert; openai: an https:// "
                        "--host)",
                        compared=False,
                        label="TLS")
    tls_ca: str = setting("", "PEM CA bundle that signed the server's certificate",
                          compared=False,
                          label="TLS CA bundle (PEM)")
    # Locust's own --tls-cert/--tls-key serve its web UI over https
    tls_cert: str = setting("", "mutual TLS: this client's PEM certificate chain (with "
                            "--tls-client-key)", flag="tls-client-cert", compared=False,
                            label="TLS client certificate (PEM)")
    tls_key: str = setting("", "the PEM private key of --tls-client-cert",
                           flag="tls-client-key", compared=False,
                           label="TLS client key (PEM)")
    auth_token: str = setting("", "bearer token sent with every call (gRPC metadata "
                              "authorization, the HTTP Authorization header); default "
                              "$MOE_AUTH_TOKEN", compared=False, secret=True,
                              label="Bearer token")

    def __post_init__(self):
        super().__post_init__()
        require(bool(self.tls_cert) == bool(self.tls_key), "tls-client-key" if self.tls_cert
                else "tls-client-cert", "--tls-client-cert and --tls-client-key go together")
        require(self.routed_experts == "off" or self.target == "openai", "routed-experts",
                f"is for --target openai (vLLM's and SGLang's HTTP APIs, this project's "
                f"server's); {self.target}'s protocol carries no routed experts")


@dataclass(frozen=True)
class Traffic(Settings):
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
                          label="Offered rate (requests/s)", when=OPEN_LOOP)
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
class Workload(Settings):
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


@dataclass(frozen=True)
class Stress(Settings):
    """Stress mode"""

    rate_start: float = setting(0.0, "stress: the first step's requests/s; 0 = --rate",
                                check=at_least(0, note=" (0 = --rate)"), compared=False,
                                label="First step's rate (requests/s; 0: the offered rate)",
                                when=STRESS)
    rate_step: float = setting(0.0, "stress: requests/s added each step", check=at_least(0),
                               compared=False,
                               label="Rate added each step (requests/s)", when=STRESS)
    rate_mult: float = setting(0.0, "stress: or multiply the rate by this each step",
                               check=at_least(0), compared=False,
                               label="Or rate multiplied each step by", when=STRESS)
    step_s: float = setting(10.0, "stress: seconds per step", check=above(0), compared=False,
                            label="Seconds per step", when=STRESS)
    max_steps: int = setting(20, "stress: most steps before giving up", check=at_least(1),
                             compared=False,
                             label="Most steps", when=STRESS)
    saturation_share: float = setting(0.9, "stress: a step whose achieved rate is below this share "
                                      "of the offered rate saturated",
                                      check=lambda v: None if 0 < v <= 1 else
                                      f"must be in (0, 1], got {v}", compared=False,
                                      label="Saturated below this share of the offered rate",
                                      when=STRESS)


@dataclass(frozen=True)
class Sla(Settings):
    """SLA search"""

    sla_resolution: float = setting(0.05, "sla: stop when the highest rate that passed and the "
                                    "lowest that failed are this close (a share of the former)",
                                    check=lambda v: None if 0 < v < 1 else
                                    f"must be in (0, 1), got {v}", compared=False,
                                    label="Resolution (share of the rate)", when=SLA)
    sla_growth: float = setting(2.0, "sla: while bracketing, the rate is multiplied (or "
                                "divided) by this from --rate", check=above(1), compared=False,
                                label="Bracketing factor", when=SLA)
    sla_warmup_s: float = setting(1.0, "sla: each probe's first seconds are sent, not judged",
                                  check=at_least(0), compared=False,
                                  label="Probe warm-up (s)", when=SLA)
    sla_probe_min_s: float = setting(10.0, "sla: a probe is judged for at least this long (past "
                                     "its warm-up) before it passes or fails on its percentile: "
                                     "a queue's excursions last longer than a second, and a "
                                     "short probe misses them", check=above(0), compared=False,
                                     label="Shortest probe (s)", when=SLA)
    sla_probe_max_s: float = setting(120.0, "sla: a probe not decided (too few requests to "
                                     "support its claims) after this long counts as failed",
                                     check=above(0), compared=False,
                                     label="Longest probe (s)", when=SLA)
    sla_max_probes: int = setting(16, "sla: most probes before giving up", check=at_least(2),
                                  compared=False, label="Most probes", when=SLA)
    sla_confirm: int = setting(0, "sla: probes repeated at the rate found, each judged as the "
                               "search's: the answer is confirmed when every one passes, and "
                               "the report gives each percentile's interval over them",
                               check=at_least(0), compared=False, label="Confirming probes",
                               when=SLA)


@dataclass(frozen=True)
class Slo(Settings):
    """Service-level objectives"""

    slo_ttft_ms: float | None = setting(None, "TTFT objective: goodput counts requests meeting "
                                        "every objective given; the share meeting each is in "
                                        "summary.json (slo) and on the console", check=above(0),
                                        compared=False,
                                        label="TTFT objective (ms)")
    slo_tpot_ms: float | None = setting(None, "TPOT objective for goodput", check=above(0),
                                        compared=False,
                                        label="TPOT objective (ms)")
    slo_e2e_ms: float | None = setting(None, "end-to-end latency objective for goodput",
                                       check=above(0), compared=False,
                                       label="End-to-end objective (ms)")
    slo_percentile: float = setting(99.0, "the percentile each objective is a claim on (p99 "
                                    "TTFT <= --slo-ttft-ms): the report judges it as MLPerf's "
                                    "server scenario does, met and supported by enough "
                                    "requests (PASS), not met (FAIL) or too few requests (NOT "
                                    "VALID)", check=open_percentile, compared=False,
                                    label="Objective percentile")


@dataclass(frozen=True)
class Sender(Settings):
    """Sending"""

    host: str = setting("127.0.0.1:50051", "the server, HOST:PORT (http://HOST:PORT for openai)",
                        option=False, check=host_port, compared=False,
                        label="Host")
    client: str = setting("auto", "who sends and times the requests: aio, a plain asyncio "
                          "process (grpc.aio, or its own HTTP/1.1 client) started beside each "
                          "Locust process, which keeps message timestamps exact to thousands of "
                          "messages/s (fixed and mixed modes); gevent, Locust's own greenlets; "
                          "auto (the default), aio where it sends the mode and gevent elsewhere "
                          "(docs/design.md, \"The default client\")",
                          choices=CLIENTS, compared=False,
                          label="Sender (auto, gevent or aio)", when={"mode": AIO_MODES})
    request_timeout_s: float = setting(120.0, "deadline of each request", check=above(0),
                                       compared=False,
                                       label="Request deadline (s)")
    max_in_flight: int = setting(1000, "open requests per process; arrivals beyond it are counted "
                                 "as not sent", check=at_least(1), compared=False,
                                 label="Most requests in flight")
    drain_s: float = setting(30.0, "after the run, seconds in-flight requests get to finish before "
                             "being cut off", check=at_least(0), compared=False,
                             label="Drain after the run (s)")
    fail_fast: bool = setting(False, "stop the run when a request fails UNAVAILABLE (the server "
                              "went away) instead of counting the failures and going on until "
                              "it is back; a server not ready at the start always stops it",
                              compared=False,
                              label="Stop when the server goes away")


@dataclass(frozen=True)
class Recording(Settings):
    """Recording"""

    warmup_s: float = setting(0.0, "requests scheduled in the first seconds are sent but not "
                              "measured", check=at_least(0), compared=False,
                              label="Warm-up, not measured (s)")
    run_dir: str = setting("", "where summary.json and histograms go (default "
                           "runs/YYYYmmdd-HHMMSS-MODE, UTC)", compared=False,
                           label="Run directory")
    interval_s: float = setting(1.0, "period of the .hlog interval histograms and of "
                                "server_stats.jsonl samples", check=at_least(0.1),
                                compared=False,
                                label="Interval of logs and samples (s)")
    server_metrics: str = setting("", "the server's Prometheus endpoints to scrape during the "
                                  "run, URL[,URL...] (each labelled by its URL), or off; default: "
                                  "the openai target's {host}/metrics when it answers, none "
                                  "for the others (moe has GetStats). Every scrape goes to "
                                  "server_metrics.jsonl, this host's GPUs (NVML) too",
                                  check=urls_or_off, compared=False,
                                  label="Server metrics URLs (or off)")
    server_metrics_interval_s: float | None = setting(None, "seconds between scrapes of "
                                                      "--server-metrics (default --interval-s)",
                                                      check=at_least(0.1), compared=False,
                                                      label="Scrape interval (s)")
    expert_record_url: str = setting("", "an SGLang server's URL whose expert distribution "
                                     "recorder to run over the measured window: started after "
                                     "the warm-up, stopped and dumped at the end "
                                     "(/start_expert_distribution_record and the others)",
                                     compared=False, label="SGLang expert recorder URL")
    expert_record_dir: str = setting("", "the server's SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR, "
                                     "where it is readable from here: the dump is copied into "
                                     "the run directory (else import it later with analysis "
                                     "import-expert-stats)", compared=False,
                                     label="SGLang recorder dump directory",
                                     when={"expert_record_url": GIVEN})
    max_request_rows: int = setting(100_000, "requests.jsonl keeps the first this many requests "
                                    "(the count of the rest is in summary.json)", check=at_least(0),
                                    compared=False,
                                    label="Most rows in requests.jsonl")


@dataclass(frozen=True)
class LoadSettings(Settings):
    target: TargetSettings = group(TargetSettings)
    traffic: Traffic = group(Traffic)
    workload: Workload = group(Workload)
    stress: Stress = group(Stress)
    sla: Sla = group(Sla)
    slo: Slo = group(Slo)
    sender: Sender = group(Sender)
    recording: Recording = group(Recording)

    def __post_init__(self):
        super().__post_init__()
        mode = self.traffic.mode
        require(mode != "stress" or self.stress.rate_step > 0 or self.stress.rate_mult > 1,
                "rate-step", "stress mode needs --rate-step above 0 or --rate-mult above 1 "
                "(the rate starts at --rate)")
        require(not self.traffic.profile or mode == "mixed", "rate-profile", "is for --mode mixed")
        require(mode != "sla" or any(v is not None for v in (
            self.slo.slo_ttft_ms, self.slo.slo_tpot_ms, self.slo.slo_e2e_ms)), "mode",
            "sla searches the highest rate meeting the objectives: give --slo-ttft-ms, "
            "--slo-tpot-ms or --slo-e2e-ms")
        require(not self.traffic.trace or mode == "fixed", "trace",
                f"replays the trace's own schedule, open loop: drop --mode {mode}")
        require(self.sender.client != "aio" or mode in AIO_MODES, "client",
                "aio sends the fixed and mixed modes' schedules only: use it with --mode fixed "
                "or mixed, or leave --client auto")

    @property
    def client(self) -> str:
        """The sender this run uses: --client, with auto resolved by the mode."""
        if self.sender.client != "auto":
            return self.sender.client
        return "aio" if self.traffic.mode in AIO_MODES else "gevent"
