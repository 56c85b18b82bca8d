"""Locust load generator for this project's moe.v1 gRPC service and the servers people deploy
(--target: OpenAI-compatible HTTP, the vLLM/SGLang/TensorRT-LLM gRPC services, Triton).

    locust -f loadgen/moe.py --host 127.0.0.1:50051                      # web UI
    locust -f loadgen/moe.py --host 127.0.0.1:50051 --headless -t 30s \\
           --mode fixed --rate 4 --prompt-tokens 64 --max-tokens 32 --run-dir runs/first

--rate alone sets the offered load (open loop): users only dispatch the schedule, each over
its own connection, so -u/-r are not needed. Locust's own statistics count each request once
(its end-to-end time from the scheduled send); TTFT, TPOT and ITL are in the web UI's Latency
(HDR) tab; the truthful numbers (HDR, from the scheduled send) go to --run-dir. The options
are the load settings of records/load_settings/; loadgen/listener.py does the rest.
"""

import argparse

import gevent
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any channel exists, or the process hangs (docs/measured.md)

from locust import User, constant, events, task  # noqa: E402
from locust.exception import StopUser  # noqa: E402

from loadgen.listener import RunListener  # noqa: E402
from loadgen.settings import REGISTRIES  # noqa: E402
from records.declare import add_arguments  # noqa: E402
from records.load_settings import LoadSettings  # noqa: E402


@events.init_command_line_parser.add_listener
def add_options(parser):
    # Locust's web UI lists only the parser's own options
    add_arguments(parser, LoadSettings, REGISTRIES, locust=True)
    # the reference servers' word (python -m loadgen.delay_server --protocol): refused, naming
    # this one's (loadgen/listener.py), where Locust's parser would suggest --profile
    parser.add_argument("--protocol", help=argparse.SUPPRESS, include_in_web_ui=False)
    # the web UI starts and stops load tests: this machine only, unless --web-host says otherwise
    parser.set_defaults(web_host="127.0.0.1")


@events.init.add_listener
def listen(environment, **_):
    environment.moe = RunListener(environment)
    # Locust arms its -t timer right after this event, from the gevent loop's cached clock,
    # which dates from the loop's last turn, before the locustfile was imported: 0.3 s stale
    # here idle, 0.9 s on a busy machine, where a 3 s run then stopped after 2.1 s.
    gevent.get_hub().loop.update_now()


class MoEUser(User):
    """Dispatches the run's open-loop arrivals (or, closed loop, its own requests) over its own
    connection to the target."""

    wait_time = constant(0)

    def on_start(self):
        self.run = self.environment.moe.run
        if self.run is None:  # the test was refused at start; send() stops this user
            return
        self.conn = self.run.target.connect(self.run.settings.sender.host)
        self.run.conns.append(self.conn)  # closed after the drain, not when the user stops

    @task
    def send(self):
        if self.run is not None:
            self.run.user(self.conn)
        raise StopUser()
