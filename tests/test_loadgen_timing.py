"""Load generator logic with scripted clocks: metric definitions, arrival schedules,
histogram clamping and queries (equal to hdrhistogram's own), request accounting, SLO shares
and when a stress step counts as short of its arrivals."""

import itertools
import random
import statistics
from types import SimpleNamespace

import pytest
from hdrh.histogram import HdrHistogram

from loadgen.modes.stress import short_of_sent
from loadgen.recording import groups
from loadgen.recording.histograms import HIGHEST_US, Binned, Histogram
from loadgen.recording.recorder import Recorder
from loadgen.recording.timing import stream_timing
from loadgen.targets.client import StreamResult
from loadgen.traffic.arrivals import arrival_offsets_s, worker_arrivals
from records import hdr
from records.declare import SettingsError, build
from records.jsonform import to_json
from records.load_settings import LoadSettings, SloSettings

MS = 1_000_000  # ns


def test_stream_timing_follows_the_definitions():
    # Scheduled at 0, sent 3 ms late, messages at 50, 60, 75, 100 ms carrying 1, 1, 2, 1 tokens.
    recv = [50 * MS, 60 * MS, 75 * MS, 100 * MS]
    t = stream_timing(0, 3 * MS, recv, [1, 1, 2, 1])
    assert t.ttft_us == 50_000 and t.ttft_service_us == 47_000
    assert t.e2e_us == 100_000 and t.e2e_service_us == 97_000
    assert t.itl_us == [10_000, 15_000, 25_000]
    assert t.e2e_us - t.ttft_us == sum(t.itl_us)
    assert t.tpot_us == (t.e2e_us - t.ttft_us) / (5 - 1)
    assert t.output_tokens == 5 and t.send_lag_us == 3_000


def test_delivery_lag_is_client_time_minus_server_time():
    # Sent at 3 ms; the server says it emitted the messages 40 and 55 ms after receiving the
    # request.
    t = stream_timing(0, 3 * MS, [45 * MS, 61 * MS], [1, 1], server_elapsed_us=[40_000, 55_000])
    assert t.delivery_lag_us == [2_000, 3_000]


def test_one_token_request_has_no_tpot():
    assert stream_timing(0, 0, [5 * MS], [1]).tpot_us is None


def test_poisson_schedule_has_the_rate_and_repeats():
    offsets = list(itertools.islice(arrival_offsets_s(20.0, "poisson", seed=1), 4000))
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20, rel=0.1)  # exponential: sd = mean
    assert offsets[:10] == list(itertools.islice(arrival_offsets_s(20.0, "poisson", seed=1), 10))


def test_constant_schedule_is_evenly_spaced():
    offsets = arrival_offsets_s(4.0, "constant", seed=0)
    assert list(itertools.islice(offsets, 4)) == [0, 0.25, 0.5, 0.75]


def test_out_of_range_values_are_clamped_and_counted():
    h = Histogram()
    h.record(-5)
    h.record(HIGHEST_US * 10)
    h.record(1500)
    assert h.count == 3 and h.clamped == 2


def test_recording_a_stream_at_once_is_recording_each_value():
    rng = random.Random(3)
    values = [0, 1, 2047, 2048, HIGHEST_US, -4, HIGHEST_US + 1, 0.6]
    values += [rng.lognormvariate(9, 4) for _ in range(5000)]  # past the top too
    one_by_one, at_once = Histogram(), Histogram()
    for v in values:
        one_by_one.record(v)
    at_once.add(Binned.of(values[:8]))  # a few: binned in Python; the edges are in these
    at_once.add(Binned.of(values[8:100]))  # many: in numpy
    at_once.add(Binned.of(values[100:]))
    assert at_once.clamped == one_by_one.clamped > 2
    assert at_once.encode() == one_by_one.encode()
    assert (at_once.hdr.min_value, at_once.hdr.max_value) == (0, HIGHEST_US)


def test_a_cleared_histogram_records_as_a_new_one_does():
    used, new = Histogram(), Histogram()
    used.add(Binned.of([5, 70_000, HIGHEST_US * 2]))
    used.clear()
    assert (used.count, used.clamped, used.stats().count) == (0, 0, 0)
    for h in (used, new):
        h.add(Binned.of([3, 3, 900, 12_345_678]))
    assert used.encode() == new.encode() and used.stats() == new.stats()


def test_each_interval_holds_what_was_recorded_since_the_take_before():
    rec = Recorder(start_ns=0, warmup_s=0)
    rec.record("ttft", 1000)
    first = rec.take_interval()
    rec.record("ttft", 2000)
    rec.record("ttft", 3000)
    assert first["ttft"].count == 1  # still whole until the next take
    second = rec.take_interval()
    assert second["ttft"].count == 2 and second["ttft"].hdr.get_min_value() == 2000
    rec.record("ttft", 4000)
    third = rec.take_interval()
    assert third is first and third["ttft"].count == 1  # the same memory, emptied
    assert rec.client["ttft"].count == 4


def test_a_group_makes_its_histograms_once_not_a_set_a_request(monkeypatch):
    made = []

    class Counted(Histogram):
        def __init__(self):
            super().__init__()
            made.append(self)

    monkeypatch.setattr(groups, "Histogram", Counted)
    chat = groups.Groups()
    for ms in range(1, 51):
        chat.record("chat", SimpleNamespace(ttft_us=1000 * ms, tpot_us=None, e2e_us=None))
    assert len(made) == len(groups.METRICS)
    assert chat.hists["chat"]["ttft"].count == 50


@pytest.mark.parametrize("n", [1, 7, 300, 20_000])
def test_histogram_queries_equal_hdrhistogram_s_own(n):
    rng = random.Random(n)
    h = Histogram()
    for _ in range(n):  # sub-millisecond to minutes, across many buckets
        h.record(rng.lognormvariate(9, 3) if rng.random() < 0.8 else rng.uniform(0, 100))
    other = Histogram()  # and after a merge, as a distributed master queries
    other.record(rng.uniform(0, 5e6))
    h.merge(other.encode(), 0)
    percentiles = [0.1, 50.0, 90.0, 99.0, 99.9, 100.0]
    assert h.percentiles_us(percentiles) == h.hdr.get_percentile_to_value_dict(percentiles)
    assert h.mean_us() == pytest.approx(h.hdr.get_mean_value(), rel=1e-12)
    # the analysis' CDF and a histogram of another shape (an .hlog may hold any)
    walked = [(i.value_iterated_to, i.count_added_in_this_iter_step)
              for i in h.hdr.get_recorded_iterator()]
    assert [tuple(map(int, b)) for b in zip(*hdr.recorded_us(h.hdr), strict=True)] == walked
    coarse = HdrHistogram(1, 60_000_000, 2)
    for v in (3, 70, 70, 12_345, 59_000_000):
        coarse.record_value(v)
    assert hdr.percentiles_us(coarse, percentiles) == coarse.get_percentile_to_value_dict(
        percentiles)


def test_every_request_is_accounted_for_and_warmup_is_not_measured():
    rec = Recorder(start_ns=0, warmup_s=1.0, slo=SloSettings(slo_ttft_ms=100, slo_e2e_ms=400))

    def result(rid, scheduled_ms, status="OK", first_ms=50):
        r = StreamResult(rid, scheduled_ms * MS, sent_ns=scheduled_ms * MS, status=status)
        if status == "OK":
            r.recv_ns = [(scheduled_ms + first_ms) * MS, (scheduled_ms + first_ms + 10) * MS]
            r.tokens = [1, 1]
        return r

    rec.add(result("warm", 500))  # completes before the window
    rec.add(result("warm-late", 900, first_ms=300))  # scheduled in warm-up, completes in the window
    rec.add(result("fast", 1500))
    rec.add(result("slow", 1600, first_ms=300))
    rec.add(result("refused", 1700, status="RESOURCE_EXHAUSTED"))
    rec.not_sent = 2
    rec.stop_ns = 3000 * MS
    assert to_json(rec.accounting()) == {"sent": 5, "ok": 4, "failed": 1, "not_sent": 2,
                                         "failed_by_code": {"RESOURCE_EXHAUSTED": 1}, "warmup": 2,
                                         "rows_omitted": 0}
    assert rec.client["ttft"].count == 2  # warm-up kept out of the latency histograms
    tp = rec.throughput(rec.window_s)
    assert tp.window_s == 2.0
    assert tp.requests_per_s == 1.5  # warm-late, fast and slow completed in the window
    assert tp.goodput_requests_per_s == 0.5  # only fast met the 100 ms TTFT objective
    assert tp.output_tokens_per_s == 3.0  # 6 tokens in the window
    assert [r.request_id for r in rec.rows] == ["warm", "warm-late", "fast", "slow", "refused"]
    # Judged: the measured ok requests, fast (60 ms e2e) and slow (310 ms e2e, 300 ms TTFT).
    assert to_json(rec.slo_shares()) == {"objectives_ms": {"ttft": 100, "e2e": 400}, "requests": 2,
                                         "met_share": {"ttft": 0.5, "e2e": 1.0, "all": 0.5}}
    assert rec.rows[2].ttft_ms == 50 and rec.rows[4].ttft_ms is None
    assert to_json(rec.rows[4]) == {"request_id": "refused", "class": "",
                                    "status": "RESOURCE_EXHAUSTED", "details": "", "warmup": False,
                                    "scheduled_ms": 1700.0, "sent_ms": 1700.0, "output_tokens": 0,
                                    "messages": 0, "ttft_ms": None, "tpot_ms": None,
                                    "e2e_ms": None}


def test_tokens_after_the_stop_are_outside_the_window():
    rec = Recorder(start_ns=0, warmup_s=0, stop_ns=100 * MS)
    r = StreamResult("straddles", 50 * MS, sent_ns=50 * MS, recv_ns=[80 * MS, 120 * MS],
                     tokens=[1, 1])
    rec.add(r)
    assert rec.window_tokens == 1 and rec.window_ok == 0  # completed during the drain


def test_merging_exports_equals_recording_everything_in_one():
    def results(n, seed):
        rng = random.Random(seed)
        for i in range(n):
            ttft_ms = rng.uniform(1, 100)
            yield StreamResult(f"{seed}-{i}", i * MS, sent_ns=i * MS,
                               recv_ns=[int((i + ttft_ms) * MS), int((i + ttft_ms + 5) * MS)],
                               tokens=[1, 1])

    def recorder():
        return Recorder(start_ns=0, warmup_s=0, slo=SloSettings(slo_ttft_ms=50),
                        stop_ns=10_000 * MS)

    a, b, one, merged = recorder(), recorder(), recorder(), recorder()
    for r in results(300, 1):
        a.add(r)
        one.add(r)
    for r in results(200, 2):
        b.add(r)
        one.add(r)
    merged.absorb(a.export())
    merged.absorb(b.export())
    assert merged.accounting() == one.accounting()
    assert merged.accounting().sent == 500
    for name in ("ttft", "tpot", "itl", "e2e", "send_lag"):
        assert merged.client[name].stats() == one.client[name].stats()
    assert merged.slo_shares() == one.slo_shares()
    assert merged.throughput(10.0) == one.throughput(10.0)
    assert len(merged.rows) == 500


def test_request_rows_are_capped_and_the_rest_counted():
    rec = Recorder(start_ns=0, warmup_s=0, stop_ns=10_000 * MS, max_rows=3)
    for i in range(5):
        rec.add(StreamResult(f"r{i}", i * MS, sent_ns=i * MS, recv_ns=[(i + 5) * MS], tokens=[1]))
    assert [r.request_id for r in rec.rows] == ["r0", "r1", "r2"]
    assert rec.accounting().rows_omitted == 2 and rec.accounting().sent == 5


def test_a_row_says_when_it_was_sent_in_unix_time():
    rec = Recorder(start_ns=5_000 * MS, warmup_s=0, start_unix_s=1_800_000_000.0)
    rec.add(StreamResult("r", 5_250 * MS, sent_ns=5_251 * MS, recv_ns=[5_260 * MS], tokens=[1]))
    rec.add(StreamResult("never", 5_300 * MS, status="UNAVAILABLE"))
    sent, never = (to_json(r) for r in rec.rows)
    assert sent["sent_ms"] == 251.0 and sent["sent_unix_s"] == pytest.approx(1_800_000_000.251)
    assert "sent_unix_s" not in never and never["sent_ms"] is None


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_schedule_keeps_the_rate_and_sets_the_burstiness(burstiness):
    schedule = arrival_offsets_s(20.0, "gamma", seed=3, burstiness=burstiness)
    offsets = list(itertools.islice(schedule, 8000))
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    cv = statistics.stdev(gaps) / statistics.mean(gaps)
    assert cv == pytest.approx(burstiness ** -0.5, rel=0.1)  # gamma: CV = 1 / sqrt(shape)


def test_workers_split_the_rate_and_never_share_an_index():
    for arrival in ("poisson", "constant"):
        parts = [list(itertools.takewhile(lambda a: a[1] < 100,
                                          worker_arrivals(10.0, arrival, 0, 3, w)))
                 for w in range(3)]
        indexes = [i for part in parts for i, _ in part]
        assert len(indexes) == len(set(indexes))
        # 10/s for 100 s in total
        assert sum(len(p) for p in parts) == pytest.approx(1000, rel=0.06)


def test_the_default_sends_the_fixed_mixed_and_sla_schedules_from_the_aio_sender():
    """--client auto: the sender that held 5,000 messages/s (docs/design.md, "The default
    client") wherever it can send the mode, greenlets elsewhere; an explicit choice stands."""
    resolved = {mode: build(LoadSettings, {"mode": mode, **extra}).client
                for mode, extra in (("fixed", {}), ("mixed", {}), ("stress", {"rate_step": 1.0}),
                                    ("closed", {}), ("sessions", {}),
                                    ("sla", {"slo_ttft_ms": 100.0}))}
    assert resolved == {"fixed": "aio", "mixed": "aio", "stress": "gevent", "closed": "gevent",
                        "sessions": "gevent", "sla": "aio"}
    assert build(LoadSettings, {"client": "gevent"}).client == "gevent"


def test_aio_client_is_for_the_fixed_mixed_and_sla_schedules():
    assert build(LoadSettings, {"client": "aio"}).sender.client == "aio"
    for mode, extra in (("stress", {"rate_step": 1.0}), ("closed", {}), ("sessions", {})):
        with pytest.raises(SettingsError,
                           match="--client: aio sends the fixed, mixed, sla modes.*auto"):
            build(LoadSettings, {"mode": mode, "client": "aio", **extra})


@pytest.mark.parametrize("achieved, sent, saturated", [
    (15, 17.0, False),  # 0.88 of the arrivals, but 2 short of 17 is within sqrt(17) = 4.1: noise
    (50, 64.0, True),  # 14 short of 64 is beyond sqrt(64) = 8, and below 0.9 x 64
    (60, 64.0, False),  # above 0.9 x 64 = 57.6
    (890, 1000.0, True),  # 110 short of 1000: beyond sqrt(1000) = 31.6, and below 0.9 x 1000
])
def test_a_stress_step_falls_short_only_beyond_the_share_and_the_counts_noise(achieved, sent,
                                                                              saturated):
    assert short_of_sent(achieved, sent, 0.9) is saturated
