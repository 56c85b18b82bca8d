"""What the load generator adds to Locust's pages, without a browser: the start form's
arrangement from the settings' declarations (every option once, the test's own first, a plain
label each, conditions that name real options and values), when a setting applies, the chart of
TTFT, TPOT and ITL over time, and the section the HTML report gains. tests/test_end_to_end.py
serves them from a real web UI and a real --html report."""

import argparse
import re
from pathlib import Path

import pytest

from loadgen.recording.histograms import Histogram
from loadgen.recording.recorder import CLIENT_METRICS
from loadgen.settings import REGISTRIES
from loadgen.web.form import FIRST, FIRST_TITLE, form_spec
from loadgen.web.html_report import with_section
from loadgen.web.timeline import PeriodFigures, Timeline
from records.declare import add_arguments, applies, build, leaves
from records.jsonform import from_json
from records.load_settings import LoadSettings
from records.summary import Summary
from tests.rundirs import summary_json


def test_the_form_lists_every_option_once_the_test_s_own_first():
    spec = form_spec()
    options = [leaf.dest for leaf in leaves(LoadSettings) if leaf.spec.option]
    assert sorted(spec["order"]) == sorted(options) and len(set(spec["order"])) == len(options)
    assert spec["order"][:len(FIRST)] == list(FIRST)
    labels = [field["label"] for field in spec["fields"].values()]
    assert len(set(labels)) == len(labels)  # a plain label each, none the generated one
    assert not [label for label in labels if "_" in label]


def test_the_form_opens_the_test_s_group_and_those_the_command_line_set():
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoadSettings, REGISTRIES)
    assert form_spec(parser.parse_args([]))["open"] == [FIRST_TITLE]
    options = parser.parse_args(["--target", "openai", "--header", "a:b", "--mode", "stress"])
    assert form_spec(options)["open"] == [FIRST_TITLE, "Target"]  # mode is the test's own
    spec = form_spec()
    assert spec["fields"]["target"]["choices"] == list(REGISTRIES["targets"])  # a choice list
    assert "choices" not in spec["fields"]["classes"]  # a spec parsed, typed in


def test_every_condition_names_an_option_and_values_it_can_take():
    fields = form_spec()["fields"]
    choices = {leaf.dest: leaf.spec.choices for leaf in leaves(LoadSettings)}
    for field in fields.values():
        for name, allowed in field["when"].items():
            assert name in fields, name
            known = (choices[name] if isinstance(choices[name], tuple)
                     else REGISTRIES[choices[name].registry] if choices[name] else None)
            if isinstance(known, tuple | dict | list):
                assert set(allowed) <= set(known), (name, allowed)


@pytest.mark.parametrize("values, shown, hidden", [
    ({}, {"rate", "prompt_tokens"}, {"rate_step", "classes", "burstiness", "endpoint"}),
    ({"mode": "stress", "rate_step": 1}, {"rate_step", "rate_start"}, {"classes", "client"}),
    ({"mode": "closed"}, {"prompt_tokens"}, {"rate", "arrival"}),
    ({"mode": "mixed"}, {"classes", "profile", "client"}, {"prompt_tokens"}),
    ({"mode": "mixed", "dataset": "d.json"}, {"dataset", "max_tokens"}, {"classes"}),
    ({"arrival": "gamma"}, {"burstiness"}, set()),
    ({"target": "openai"}, {"endpoint", "tokenizer", "model"}, {"triton_backend"}),
])
def test_a_setting_applies_only_where_its_conditions_hold(values, shown, hidden):
    settings = build(LoadSettings, {"host": "127.0.0.1:1"} | values)
    applying = {leaf.name for leaf in leaves(LoadSettings) if applies(leaf, settings)}
    assert shown <= applying and not hidden & applying


def periods(*ttft_ms_lists) -> Timeline:
    timeline = Timeline(interval_s=1.0, max_points=3)
    for i, values in enumerate(ttft_ms_lists):
        interval = {name: Histogram() for name in CLIENT_METRICS}
        for v in values:
            interval["ttft"].record(v * 1000)
        timeline.add(float(i + 1), interval)
    return timeline


def test_the_timeline_keeps_the_last_periods_with_their_percentiles():
    timeline = periods([5.0], [10.0] * 99 + [200.0], [], [7.0, 9.0])
    assert [p.t_s for p in timeline.points] == [2.0, 3.0, 4.0]
    second = timeline.points[0].figures["ttft"]
    assert second.count == 100 and second.p50_ms == pytest.approx(10, rel=1e-3)
    assert second.p99_ms == pytest.approx(10, rel=1e-3)  # the 99th of 100 values
    assert timeline.points[1].figures["ttft"] == PeriodFigures(0, None, None)


def test_the_chart_breaks_its_lines_where_a_period_had_no_samples():
    svg = periods([5.0], [10.0], [], [7.0], [8.0]).svg()  # kept: [], [7], [8]
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "the last 3" in svg and "TTFT (ms)" in svg and "TPOT (ms)" in svg
    # TTFT's two later periods make one line each for p50 and p99; TPOT and ITL had no samples
    assert svg.count("<polyline") == 2 and svg.count("no samples yet") == 2
    gapped = periods([5.0], [], [6.0]).svg()
    assert gapped.count("<circle") == 4 and "<polyline" not in gapped
    assert gapped.count('fill="#eee"') == 1  # the empty period shaded, in TTFT's panel only


def test_the_chart_fills_the_width_asked_with_a_tick_per_round_step():
    timeline = Timeline(interval_s=1.0)
    for t in range(1, 121):
        interval = {name: Histogram() for name in CLIENT_METRICS}
        interval["ttft"].record(1000 * (10 + t % 7))
        timeline.add(float(t), interval)
    wide = timeline.svg(1200)
    assert 'width="1200"' in wide and 'width="720"' in timeline.svg()
    assert 'width="2400"' in timeline.svg(10**6) and 'width="480"' in timeline.svg(1)
    ttft = wide[wide.index("TTFT (ms)"):wide.index("TPOT (ms)")]
    # 0 to 120 s over ~1100 px: a tick each 15 s, written as a clock past a minute
    assert re.findall(r">(\d+ s|\d+:\d\d)<", ttft) == [
        "0 s", "15 s", "30 s", "45 s", "1:00", "1:15", "1:30", "1:45", "2:00"]
    assert re.findall(r">(\d+)<", ttft) == ["0", "5", "10", "15", "20"]  # p99 up to 16


def test_the_chart_shows_the_server_queue_and_kv_usage_where_it_was_scraped():
    timeline = Timeline(interval_s=1.0)
    for t, server in enumerate([{}, {"waiting": 3.0, "running": 4.0, "kv_usage": 0.5},
                                {"waiting": 6.0, "running": 4.0, "kv_usage": 0.75}]):
        timeline.add(float(t), {name: Histogram() for name in CLIENT_METRICS}, server)
    svg = timeline.svg()
    assert "server: requests waiting (red) and running (blue)" in svg
    assert "server: KV-cache usage (%)" in svg
    assert svg.count("<polyline") == 3  # waiting, running, KV usage: one line each
    kv = svg[svg.index("KV-cache usage"):]
    assert [">0<", ">20<", ">40<", ">60<", ">80<"] == re.findall(r">\d+<", kv)  # to 75, gridded
    assert "server:" not in periods([5.0]).svg()  # no scraped gauges: no server panels


def test_the_html_report_opens_with_the_run_s_figures(tmp_path):
    summary = from_json(Summary, summary_json(metrics={
        "ttft_ms": {"count": 40, "mean": 12.0, "p50": 11.0, "p90": 15.0, "p95": 16.0,
                    "p99": 19.5, "max": 25.0}}, requests={
        "sent": 41, "ok": 40, "failed": 1, "not_sent": 0, "failed_by_code": {"INTERNAL": 1},
        "warmup": 0}), "summary.json")
    page = ('<html><head><script>const s = "<body>";</script></head>'
            '<body style="margin:0"><div id="root"></div></body></html>')
    out = with_section(page, summary, Path("runs/x"), periods([5.0], [6.0]))
    section = out[out.index('<body style="margin:0">'):out.index('<div id="root">')]
    assert "runs/x" in section and "sent 41 = ok 40 + failed 1 (INTERNAL 1)" in section
    assert re.search(r"<td[^>]*>TTFT</td><td[^>]*>40</td><td[^>]*>11.0</td>", section)
    assert "<svg" in section
    assert out.startswith('<html><head><script>const s = "<body>";')  # the script's own tag
    assert "distributed" in with_section(page, summary, Path("runs/x"), None)
