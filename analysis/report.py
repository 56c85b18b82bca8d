"""A run's report: the text for stdout, report.md, and the headline figures as one JSON object."""

import argparse
import json
from dataclasses import dataclass

from analysis.latency import stats_ms
from analysis.plot import plot_latency_cdf
from analysis.rundir import Run, RunDirError, load_run
from analysis.server_stats import ServerView, expert_shares, server_view
from analysis.tables import STAT_COLUMNS, fmt_ms, markdown_table, stats_rows, text_table

LATENCY_ROWS = ("ttft", "ttft_service", "tpot", "itl", "e2e")
REPORT_MD = "report.md"
CDF_PNG = "latency_cdf.png"


@dataclass(frozen=True)
class Report:
    run: Run
    latency: dict[str, dict | None]  # LATENCY_ROWS name -> stats in ms, None without samples
    server: ServerView | None

    @classmethod
    def of(cls, run: Run) -> "Report":
        latency = {name: stats_ms(run.histograms.get(name)) for name in LATENCY_ROWS}
        return cls(run, latency, server_view(run.section("server")))


def add_command(commands) -> None:
    parser = commands.add_parser("report", help="percentile tables, plots and diagnosis of one run: report.md")
    parser.add_argument("run_dir", help="directory holding summary.json and histograms.json")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> None:
    run = load_run(args.run_dir)
    result = Report.of(run)
    print(render_text(result))
    try:
        plot_latency_cdf(run.histograms, run.path / CDF_PNG)
        (run.path / REPORT_MD).write_text(render_markdown(result))
    except OSError as e:  # the message names the file
        raise RunDirError(f"cannot write the report: {e}") from None
    print(f"\nreport: {run.path / REPORT_MD}")
    # Last line: machine-readable headline figures.
    print(json.dumps(headline(result)))


def render_text(report: Report) -> str:
    run = report.run
    parts = [f"run {run.path}: {_window(run)}"]
    if config := run.section("config"):
        parts.append("config: " + " ".join(f"{key}={_plain(value)}" for key, value in config.items()))
    parts.append(text_table(["latency (ms)", *STAT_COLUMNS.values()], stats_rows(report.latency)))
    if run.section("throughput"):
        parts.append("throughput: " + ", ".join(_throughput(run)))
    if run.section("requests"):
        parts.append(f"requests: {_accounting(run)}")
    if run.section("classes"):
        parts.append(text_table(CLASS_HEADER, _classes(run)))
    if run.section("stress"):
        parts.append(text_table(STEP_HEADER, _steps(run)) + "\n" + _knee(run))
    if server_time := run.section("server_time_ms"):
        parts.append(text_table(["server time (ms)", *STAT_COLUMNS.values()], stats_rows(server_time)))
    if report.server:
        parts.append("\n".join(_server_text(report.server)))
    if generator := _generator(run):
        parts.append("\n".join(f"generator: {line}" for line in generator))
    return "\n\n".join(parts)


def render_markdown(report: Report) -> str:
    run = report.run
    parts = [f"# Run report: {run.path.resolve().name}", f"Run directory `{run.path}`; {_window(run)}."]
    if config := run.section("config"):
        rows = [[key, f"`{_plain(value)}`"] for key, value in config.items()]
        parts += ["## Config", markdown_table(["setting", "value"], rows)]
    parts += ["## Latency (ms)", markdown_table(["metric", *STAT_COLUMNS.values()], stats_rows(report.latency)),
              "Percentiles decoded from the HDR histograms in histograms.json (3 significant digits).",
              f"![latency CDF]({CDF_PNG})"]
    if run.section("throughput"):
        parts += ["## Throughput", _bullets(_throughput(run))]
    if requests := run.section("requests"):
        row = [_plain(requests.get(key)) for key in ("sent", "ok", "failed", "not_sent", "warmup")]
        parts += ["## Requests", markdown_table(["sent", "ok", "failed", "not sent", "warm-up"], [row])]
        if by_code := _by_count(requests.get("failed_by_code") or {}):
            parts.append("Failed by status code:\n\n" + _bullets(f"{code}: {n}" for code, n in by_code))
    if run.section("classes"):
        parts += ["## Request classes (ms)", markdown_table(CLASS_HEADER, _classes(run))]
    if run.section("stress"):
        parts += ["## Stress steps", markdown_table(STEP_HEADER, _steps(run)), _knee(run)]
    if report.server or run.section("server_time_ms"):
        parts += ["## Server", *_server_markdown(report.server, run.section("server_time_ms"))]
    if generator := _generator(run):
        parts += ["## Generator", _bullets(generator)]
    return "\n\n".join(parts) + "\n"


def headline(report: Report) -> dict:
    def latency(name: str, key: str) -> float | None:
        stats = report.latency[name]
        return round(stats[key], 3) if stats else None

    run = report.run
    throughput, requests = run.section("throughput"), run.section("requests")
    return {"run_dir": str(run.path), "report_md": str(run.path / REPORT_MD),
            "ttft_p50_ms": latency("ttft", "p50"), "ttft_p99_ms": latency("ttft", "p99"),
            "tpot_p50_ms": latency("tpot", "p50"), "tpot_p99_ms": latency("tpot", "p99"),
            "e2e_p99_ms": latency("e2e", "p99"),
            "output_tokens_per_s": throughput.get("output_tokens_per_s"),
            "requests_per_s": throughput.get("requests_per_s"),
            "goodput_requests_per_s": throughput.get("goodput_requests_per_s"),
            "ok": requests.get("ok"), "failed": requests.get("failed")}


def _window(run: Run) -> str:
    summary = run.summary
    return (f"started {_plain(summary.get('started_at'))}, measured window {_num(summary.get('window_s'), '.1f')} s"
            f" of {_num(summary.get('duration_s'), '.1f')} s")


def _throughput(run: Run) -> list[str]:
    throughput, config = run.section("throughput"), run.section("config")
    slos = [f"{name} ≤ {config[key]} ms" for name, key in (("TTFT", "slo_ttft_ms"), ("TPOT", "slo_tpot_ms"),
                                                            ("E2E", "slo_e2e_ms"))
            if config.get(key) is not None]
    lines = [f"{_num(throughput.get('output_tokens_per_s'), '.1f')} output tokens/s",
             f"{_num(throughput.get('requests_per_s'), '.2f')} requests/s",
             f"goodput {_num(throughput.get('goodput_requests_per_s'), '.2f')} requests/s "
             f"({'SLO ' + ', '.join(slos) if slos else 'no SLO set'})"]
    share = run.section("slo").get("met_share") or {}
    if run.section("slo").get("objectives_ms") and share.get("all") is not None:
        lines.append("met: " + ", ".join(f"{name.upper() if name != 'all' else 'all'} {100 * v:.1f}%"
                                         for name, v in share.items() if v is not None))
    return lines


def _classes(run: Run) -> list[list[str]]:
    rows = []
    for name, c in run.section("classes").items():
        ttft, tpot = c.get("ttft_ms") or {}, c.get("tpot_ms") or {}
        rows.append([name, _plain(c.get("sent")), _plain(c.get("ok")), fmt_ms(ttft.get("p50")), fmt_ms(ttft.get("p99")),
                     fmt_ms(tpot.get("p50")), fmt_ms(tpot.get("p99"))])
    return rows


CLASS_HEADER = ["class", "sent", "ok", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
STEP_HEADER = ["step", "offered/s", "sent/s", "achieved/s", "goodput/s", "TTFT p99", "TPOT p99", "saturated"]


def _steps(run: Run) -> list[list[str]]:
    return [[str(r["step"]), _num(r["offered_rps"], ".3g"), _num(r["sent_rps"], ".3g"), _num(r["achieved_rps"], ".3g"),
             _num(r["goodput_rps"], ".3g"), fmt_ms(r["ttft_p99_ms"]), fmt_ms(r["tpot_p99_ms"]), r["saturated"] or "-"]
            for r in run.section("stress").get("steps", [])]


def _knee(run: Run) -> str:
    stress = run.section("stress")
    knee = stress.get("knee_rps")
    return (f"knee: {'none (the first step saturated)' if knee is None else f'{knee:g} requests/s'}; "
            f"stopped: {stress.get('stopped_because', '-')}")


def _accounting(run: Run) -> str:
    requests = run.section("requests")
    by_code = ", ".join(f"{code} {n}" for code, n in _by_count(requests.get("failed_by_code") or {}))
    return (f"sent {_plain(requests.get('sent'))}, ok {_plain(requests.get('ok'))}, "
            f"failed {_plain(requests.get('failed'))}{f' ({by_code})' if by_code else ''}, "
            f"not sent {_plain(requests.get('not_sent'))}, warm-up {_plain(requests.get('warmup'))}")


def _generator(run: Run) -> list[str]:
    generator = run.section("generator")
    lines = []
    if "late_sends" in generator:
        lines.append(f"late sends {generator['late_sends']} (sent more than "
                     f"{_num(generator.get('late_threshold_ms'), '.1f')} ms after their scheduled time)")
    for name, what in (("send_lag", "send lag (scheduled -> sent)"),
                       ("delivery_lag", "delivery lag (server emit -> client timestamp)")):
        lag = stats_ms(run.histograms.get(name))
        if lag:
            lines.append(f"{what} p50 {fmt_ms(lag['p50'])} ms, p99 {fmt_ms(lag['p99'])} ms, "
                         f"max {fmt_ms(lag['max'])} ms")
    return lines + [f"warning: {warning}" for warning in generator.get("warnings") or []]


def _server_fields(server: ServerView) -> list[tuple[str, str]]:
    return [("policy", _plain(server.policy)), ("preset", _plain(server.preset)), ("device", _plain(server.device)),
            ("steps", _plain(server.steps)), ("tokens generated", _plain(server.tokens_generated)),
            ("requests finished", _plain(server.requests_finished)),
            ("mean batch size", _num(server.mean_batch_size, ".2f")),
            ("step time mean", f"{fmt_ms(server.step_time_mean_ms)} ms")]


def _server_text(server: ServerView) -> list[str]:
    lines = [f"server ({server.basis}): " + ", ".join(f"{name} {value}" for name, value in _server_fields(server))]
    if server.expert_tokens is not None:
        shares = expert_shares(server.expert_tokens)
        layer, expert = divmod(int(shares.argmax()), shares.shape[1])
        uniform = 1 / shares.shape[1]
        lines.append(f"experts: hottest share per layer {' '.join(f'{s:.3f}' for s in shares.max(axis=1))} "
                     f"(uniform {uniform:.3f}); hottest overall layer {layer} expert {expert}, "
                     f"{shares[layer, expert] / uniform:.2f}x uniform")
    return lines


def _server_markdown(server: ServerView | None, server_time: dict) -> list[str]:
    parts = []
    if server:
        fields = [list(field) for field in _server_fields(server)]
        parts += [f"Counters: {server.basis}.", markdown_table(["field", "value"], fields)]
    if server_time:
        parts += ["### Server-side timing (ms)",
                  markdown_table(["phase", *STAT_COLUMNS.values()], stats_rows(server_time))]
    if server and server.expert_tokens is not None:
        shares = expert_shares(server.expert_tokens)
        n_experts = shares.shape[1]
        rows = [[str(layer), str(int(tokens.sum())), str(int(row.argmax())), f"{row.max():.3f}",
                 f"{row.max() * n_experts:.2f}x", " ".join(f"{s:.3f}" for s in row)]
                for layer, (tokens, row) in enumerate(zip(server.expert_tokens, shares, strict=True))]
        parts += [f"### Expert token share per layer (uniform 1/{n_experts} = {1 / n_experts:.3f})",
                  markdown_table(["layer", "routed tokens", "hottest expert", "its share", "vs uniform",
                                  "share by expert id"], rows)]
    return parts


def _by_count(counts: dict) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: -item[1])


def _bullets(lines) -> str:
    return "\n".join(f"- {line}" for line in lines)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _plain(value: object) -> str:
    return "none" if value is None else str(value)
