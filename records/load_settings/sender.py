"""How the load generator sends and what it records."""

from __future__ import annotations

from dataclasses import dataclass

from records.checks import above, at_least, host_port, urls_or_off
from records.declare import GIVEN, Settings, setting
from records.load_settings.choices import (
    AIO_MODES,
    CLIENTS,
)


@dataclass(frozen=True)
class SenderSettings(Settings):
    """Sending"""

    host: str = setting("127.0.0.1:50051", "the server, HOST:PORT (http://HOST:PORT for openai)",
                        option=False, check=host_port, compared=False,
                        label="Host")
    client: str = setting("auto", "who sends and times the requests: aio, a plain asyncio "
                          "process (grpc.aio, or its own HTTP/1.1 client) started beside each "
                          "Locust process, which keeps message timestamps exact to thousands of "
                          "messages/s (fixed, mixed and sla modes); gevent, Locust's own "
                          "greenlets; auto (the default), aio where it sends the mode and gevent "
                          "elsewhere (docs/design.md, \"The default client\")",
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
class RecordingSettings(Settings):
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
