"""Locust load generator for the moe.v1.MoEInference gRPC service.

    locust -f loadgen/moe.py --host 127.0.0.1:50051                      # web UI
    locust -f loadgen/moe.py --host 127.0.0.1:50051 --headless -t 30s \\
           --mode fixed --rate 4 --prompt-tokens 64 --max-tokens 32 --run-dir runs/first

--rate alone sets the offered load (open loop): users only dispatch the schedule, each over
its own channel, so -u/-r are not needed. TTFT, TPOT and E2E also appear in Locust's own
statistics; the truthful numbers (HDR, from the scheduled send) go to --run-dir.
"""

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists, or the process hangs (docs/measured.md)

import gc  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import grpc  # noqa: E402
from locust import User, constant, events, task  # noqa: E402
from locust.exception import StopUser  # noqa: E402
from locust.runners import MasterRunner, WorkerRunner  # noqa: E402

from loadgen.arrivals import ARRIVALS  # noqa: E402
from loadgen.client import server_stats  # noqa: E402
from loadgen.config import MODES, ConfigError, LoadConfig  # noqa: E402
from loadgen.console import print_summary  # noqa: E402
from loadgen.distributed import MESSAGE, PART_GRACE_S, STOP_MESSAGE, worker_message, write_merged  # noqa: E402
from loadgen.run import Run  # noqa: E402
from loadgen.rundir import write_run_dir  # noqa: E402
from loadgen.summary import histogram_encodings  # noqa: E402
from proto import moe_pb2_grpc  # noqa: E402

log = logging.getLogger("loadgen")


@events.init_command_line_parser.add_listener
def add_options(parser):
    d = LoadConfig()
    g = parser  # Locust's own parser: only it knows include_in_web_ui
    g.add_argument("--mode", choices=MODES, default=d.mode, include_in_web_ui=True,
                   help="fixed: constant offered rate, open loop; stress: the rate rises each --step-s until "
                        "the server saturates; mixed: request classes (--classes) at a rate shaped by "
                        "--rate-profile; closed: -u users, each sending its next request when the last ends "
                        "(under-states queueing)")
    g.add_argument("--rate", type=float, default=d.rate, include_in_web_ui=True,
                   help="offered requests/s, total across users and workers")
    g.add_argument("--arrival", choices=ARRIVALS, default=d.arrival, include_in_web_ui=True,
                   help="gaps between sends: poisson (exponential), constant, or gamma (see --burstiness)")
    g.add_argument("--burstiness", type=float, default=d.burstiness, include_in_web_ui=True,
                   help="gamma arrivals: shape; below 1 burstier than Poisson, 1 is Poisson")
    g.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens, include_in_web_ui=True,
                   help="prompt length of each request, in tokens")
    g.add_argument("--prompt-tokens-max", type=int, default=d.prompt_tokens_max, include_in_web_ui=True,
                   help="above 0: prompt lengths uniform between --prompt-tokens and this")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens, include_in_web_ui=True,
                   help="output tokens per request (sent with ignore_eos, so exact)")
    g.add_argument("--warmup-s", type=float, default=d.warmup_s, include_in_web_ui=True,
                   help="requests scheduled in the first seconds are sent but not measured")
    g.add_argument("--seed", type=int, default=d.seed, include_in_web_ui=True,
                   help="seed of the arrival schedule and prompts, so runs repeat")
    g.add_argument("--run-dir", default="", include_in_web_ui=True,
                   help="where summary.json and histograms go (default runs/<UTC time>)")
    g.add_argument("--request-timeout-s", type=float, default=d.request_timeout_s,
                   help="gRPC deadline of each request")
    g.add_argument("--max-in-flight", type=int, default=d.max_in_flight,
                   help="open requests per process; arrivals beyond it are counted as not sent")
    g.add_argument("--drain-s", type=float, default=d.drain_s,
                   help="after the run, seconds in-flight requests get to finish before being cut off")
    g.add_argument("--rate-start", type=float, default=d.rate_start, include_in_web_ui=True,
                   help="stress: the first step's requests/s (default --rate)")
    g.add_argument("--rate-step", type=float, default=d.rate_step, include_in_web_ui=True,
                   help="stress: requests/s added each step")
    g.add_argument("--rate-mult", type=float, default=d.rate_mult,
                   help="stress: or multiply the rate by this each step")
    g.add_argument("--step-s", type=float, default=d.step_s, include_in_web_ui=True, help="stress: seconds per step")
    g.add_argument("--max-steps", type=int, default=d.max_steps, help="stress: most steps before giving up")
    g.add_argument("--saturation-share", type=float, default=d.saturation_share,
                   help="stress: a step whose achieved rate is below this share of the offered rate saturated")
    g.add_argument("--classes", default=d.classes, include_in_web_ui=True,
                   help="mixed: request classes name:weight:prompt_tokens:max_tokens, comma-separated")
    g.add_argument("--rate-profile", dest="rate_profile", default=d.profile, include_in_web_ui=True,
                   help="mixed: sinusoid:PERIOD_S:AMPLITUDE, bursts:EVERY_S:LENGTH_S:FACTOR or trace:FILE")
    g.add_argument("--dataset", default=d.dataset,
                   help="ShareGPT-style JSON: prompts and output lengths (capped by --max-tokens) from it")
    g.add_argument("--client", choices=("gevent", "aio"), default=d.client,
                   help="who sends and times requests: gevent (Locust's greenlets) or aio (a grpc.aio process "
                        "beside each Locust process)")
    g.add_argument("--max-request-rows", type=int, default=d.max_request_rows,
                   help="requests.jsonl keeps the first this many requests (the count of the rest is in summary.json)")
    g.add_argument("--interval-s", type=float, default=d.interval_s,
                   help="period of the .hlog interval histograms and of server_stats.jsonl samples")
    g.add_argument("--slo-ttft-ms", type=float, default=None, help="TTFT objective for goodput")
    g.add_argument("--slo-tpot-ms", type=float, default=None, help="TPOT objective for goodput")
    g.add_argument("--slo-e2e-ms", type=float, default=None, help="end-to-end latency objective for goodput")


def load_config(environment) -> LoadConfig:
    o = environment.parsed_options

    def optional(value):
        return None if value in (None, "") else float(value)

    return LoadConfig(
        host=environment.host or "", mode=o.mode, rate=float(o.rate), arrival=o.arrival,
        burstiness=float(o.burstiness),
        prompt_tokens=int(o.prompt_tokens), prompt_tokens_max=int(o.prompt_tokens_max), max_tokens=int(o.max_tokens),
        warmup_s=float(o.warmup_s), seed=int(o.seed),
        run_dir=o.run_dir or time.strftime(f"runs/%Y%m%d-%H%M%S-{o.mode}", time.gmtime()),
        request_timeout_s=float(o.request_timeout_s), max_in_flight=int(o.max_in_flight),
        drain_s=float(o.drain_s), interval_s=float(o.interval_s),
        max_request_rows=int(o.max_request_rows), client=o.client, rate_start=float(o.rate_start),
        rate_step=float(o.rate_step),
        rate_mult=float(o.rate_mult), step_s=float(o.step_s), max_steps=int(o.max_steps),
        saturation_share=float(o.saturation_share), classes=o.classes, profile=o.rate_profile,
        dataset=o.dataset, slo_ttft_ms=optional(o.slo_ttft_ms),
        slo_tpot_ms=optional(o.slo_tpot_ms), slo_e2e_ms=optional(o.slo_e2e_ms))


class MoEUser(User):
    """Dispatches the run's open-loop arrivals over its own channel."""

    wait_time = constant(0)

    def on_start(self):
        self.run: Run | None = getattr(self.environment, "moe_run", None)
        if self.run is None:  # the test was refused at start; send() stops this user
            return
        channel = grpc.insecure_channel(self.environment.host)
        self.run.channels.append(channel)  # closed after the drain, not when the user stops
        self.stub = moe_pb2_grpc.MoEInferenceStub(channel)

    @task
    def send(self):
        if self.run is not None and self.run.config.mode == "closed":
            self.run.closed_loop(self.stub)
        elif self.run is not None:
            self.run.dispatch(self.stub)
        raise StopUser()


@events.init.add_listener
def check_options(environment, **_):
    """Bad flags end the process before any request, naming the flag."""
    if environment.parsed_options is None:
        return
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(MESSAGE, lambda msg, **_: receive_part(environment, msg.data))
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(STOP_MESSAGE, lambda msg, **_: gevent.spawn(finish_run, environment))
    if environment.host or environment.parsed_options.headless:
        try:
            load_config(environment)
        except (ConfigError, ValueError) as exc:
            sys.exit(f"loadgen/moe.py: {exc}")


def end_test(environment) -> None:
    """Ends the test as -t would: headless the process quits, in the web UI the test stops."""
    gevent.spawn(environment.runner.quit if environment.parsed_options.headless else environment.runner.stop)


def refuse(environment, message: str) -> None:
    """Ends a test that cannot run: headless, the process exits 2; in the web UI, the test stops."""
    log.error("%s", message)
    environment.moe_run = None
    if environment.parsed_options.headless:
        environment.process_exit_code = 2
    end_test(environment)  # not from inside the spawning greenlet


@events.test_start.add_listener
def start_run(environment, **_):
    try:
        config = load_config(environment)
    except (ConfigError, ValueError) as exc:  # set in the web UI
        refuse(environment, str(exc))
        return
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        environment.parsed_options.moe_ranks = None  # a refused test must not pass on the last one's
        if config.mode == "stress":
            refuse(environment, "--mode stress runs in one process (it judges each step as it ends); "
                   "drop --master/--processes")
            return
        if runner.target_user_count < runner.worker_count:
            refuse(environment, f"{runner.worker_count} workers need at least {runner.worker_count} users "
                   f"(-u {runner.worker_count}): each worker's users send its share of --rate")
            return
        # Ranks 0..N-1 by client id (Locust's worker indexes can have gaps); they reach the
        # workers with the spawn message.
        ranks = {c.id: i for i, c in enumerate(sorted(runner.clients.ready + runner.clients.running
                                                       + runner.clients.spawning, key=lambda c: c.id))}
        environment.parsed_options.moe_ranks = ranks
        environment.moe_master = {"config": config, "expected": len(ranks), "parts": {}, "written": False,
                                  "server_start": server_stats(config.host)}
        return

    def report(result, timing):
        fire = environment.events.request.fire
        if not result.ok:
            fire(request_type="grpc", name="Generate", response_time=(result.recv_ns[-1] - result.sent_ns) / 1e6
                 if result.recv_ns else 0, response_length=sum(result.tokens),
                 exception=RuntimeError(f"{result.status}: {result.details}"), context={})
            return
        if timing is None:  # warm-up
            return
        fire(request_type="grpc", name="TTFT", response_time=timing.ttft_us / 1000, response_length=0,
             exception=None, context={})
        if timing.tpot_us is not None:
            fire(request_type="grpc", name="TPOT", response_time=timing.tpot_us / 1000, response_length=0,
                 exception=None, context={})
        fire(request_type="grpc", name="E2E", response_time=timing.e2e_us / 1000,
             response_length=timing.output_tokens, exception=None, context={})

    # Everything built so far lives for the whole run: keep the collector from walking it, so
    # its pauses (tens of ms in a busy process) do not land in the timestamps.
    gc.collect()
    gc.freeze()
    environment.moe_server_start = server_stats(config.host)
    if "error" in environment.moe_server_start:
        log.warning("server at %s: %s", config.host, environment.moe_server_start["error"])
    if isinstance(runner, WorkerRunner):
        ranks = getattr(environment.parsed_options, "moe_ranks", None) or {}
        if runner.client_id not in ranks:
            environment.moe_run = None  # refused by the master (its log says why), or joined mid-test
            return
        rank = ranks[runner.client_id]
        environment.moe_run = Run(config, report, lambda: server_stats(config.host), len(ranks), rank,
                                  f"{config.run_dir}/worker-{rank}")
        environment.moe_rank = rank
    else:
        environment.moe_run = Run(config, report, lambda: server_stats(config.host),
                                  request_stop=lambda: end_test(environment))
    prompt = f"{config.prompt_tokens}-{config.prompt_tokens_max}" if config.prompt_tokens_max \
        else str(config.prompt_tokens)
    if config.mode == "closed":
        log.info("closed loop: each user sends its next request when the last ends; %s prompt + %d output "
                 "tokens, results to %s", prompt, config.max_tokens, config.run_dir)
    else:
        log.info("open loop: %.3g requests/s (%s), %s prompt + %d output tokens, results to %s",
                 config.rate, config.arrival, prompt, config.max_tokens, config.run_dir)


@events.test_stopping.add_listener
def stop_schedule(environment, **_):
    run = getattr(environment, "moe_run", None)
    if run is not None:
        run.stop()
    if getattr(environment, "moe_master", None) is not None:
        # Locust's headless quit tells workers to quit only after the master's test_stop, and
        # then waits 0.5 s: workers must stop and drain now, so their results arrive in time.
        for client in environment.runner.clients.all:
            environment.runner.send_message(STOP_MESSAGE, client_id=client.id)


@events.test_stop.add_listener
def finish_run(environment, **_):
    if getattr(environment, "moe_master", None) is not None:
        await_parts(environment)
        return
    run: Run | None = getattr(environment, "moe_run", None)
    if run is None:
        return
    environment.moe_run = None
    run.drain()
    for channel in run.channels:
        channel.close()
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(MESSAGE, worker_message(environment.moe_rank, run))
        return
    summary = run.summary()
    summary["server"] = {"start": environment.moe_server_start, "end": server_stats(run.config.host)}
    path = write_run_dir(run.config.run_dir, summary, histogram_encodings(run.recorder), run.recorder.rows)
    if run.stress is not None:
        run.stress.write_csv(path)
    print_summary(summary, path)


def receive_part(environment, part: dict) -> None:
    """Master: one worker's results, once per rank."""
    master = getattr(environment, "moe_master", None)
    if master is not None and not master["written"]:
        master["parts"].setdefault(part["worker"], part)


def await_parts(environment) -> None:
    """Master: waits for every worker's results (their drains included, bounded), then writes
    the merged run, marked incomplete if a worker never reported."""
    master = environment.moe_master
    deadline = time.monotonic() + master["config"].drain_s + PART_GRACE_S
    while len(master["parts"]) < master["expected"] and time.monotonic() < deadline:
        gevent.sleep(0.1)
    master["written"] = True
    environment.moe_master = None
    if not master["parts"]:
        log.error("no worker reported results: nothing to write")
        return
    config = master["config"]
    server = {"start": master["server_start"], "end": server_stats(config.host)}
    summary, path = write_merged(config, list(master["parts"].values()), master["expected"], server)
    print_summary(summary, path)
