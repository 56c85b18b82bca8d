"""`python -m analysis compare` with confidence intervals, on run directories built here from known
distributions: a run whose TTFTs are exactly twice another's comes out x2.0 (within HDR precision)
and significantly worse; two samples of one distribution come out "no significant difference";
the Beta shortcut for a percentile's bootstrap matches a brute-force resampling bootstrap and the
exact binomial law, and its intervals cover the true median as often as they claim; percentiles
follow HdrHistogram's rank rule; the throughput and goodput point estimates and bins match counts
made by hand; differing workloads and servers are warned about; too few requests and a missing,
cut-short or empty requests.jsonl give point estimates only, saying why; goodput under different
SLOs gets no verdict; bad input exits 2 naming the file or flag; compare.png is a real PNG of the
expected size."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from analysis import bootstrap
from analysis.compare import compare
from analysis.confidence import METRICS, window_edges_ms
from analysis.readers.rundir import load_run
from tests.cli import Done, analysis
from tests.rundirs import encoded, histogram, png_size, request_row, write_rows, write_summary

LATENCY = [m.key for m in METRICS if m.q is not None]


def write_run(run_dir: Path, ttft_ms, tpot_ms, *, tokens: int = 32, config: dict | None = None,
              rows: list[dict] | None = None, summary: dict | None = None) -> None:
    """A run of len(ttft_ms) measured OK requests sent 100 ms apart; histograms and rows hold the
    same values."""
    run_dir.mkdir(parents=True)
    ttft_ms, tpot_ms = np.asarray(ttft_ms, dtype=float), np.asarray(tpot_ms, dtype=float)
    e2e_ms = ttft_ms + (tokens - 1) * tpot_ms
    n = len(ttft_ms)
    if rows is None:
        values = zip(ttft_ms, tpot_ms, e2e_ms, strict=True)
        rows = [request_row(i, t, p, e, output_tokens=tokens) for i, (t, p, e) in enumerate(values)]
    write_rows(run_dir / "requests.jsonl", rows)
    base = {"window_s": n * 0.1, "duration_s": max(30.2, n * 0.1),
            "config": {"mode": "fixed", "rate": 10.0, "arrival": "constant", "prompt_tokens": 64,
                       "max_tokens": tokens, "seed": 0, "warmup_s": 0.0, "interval_s": 1.0,
                       "slo_ttft_ms": None, "slo_tpot_ms": None,
                       "slo_e2e_ms": None} | (config or {}),
            "requests": {"sent": n, "ok": n, "failed": 0, "not_sent": 0, "failed_by_code": {},
                         "warmup": 0}}
    write_summary(run_dir, **(base | (summary or {})))
    hists = {"ttft": encoded(ttft_ms), "tpot": encoded(tpot_ms), "e2e": encoded(e2e_ms)}
    (run_dir / "histograms.json").write_text(json.dumps(hists))


def lognormal(seed: int, n: int, median_ms: float) -> np.ndarray:
    """Whole microseconds, so that doubling is exact in the histogram too."""
    samples = np.random.default_rng(seed).lognormal(math.log(median_ms), 0.5, n)
    return np.round(samples * 1000) / 1000


def by_run(headline: dict, key: str) -> dict:
    return {r["run"]: r for r in headline["comparisons"][key]["runs"]}


def run_cli(*args) -> Done:
    return analysis("compare", *args)


# --- the statistics on their own ---

@pytest.mark.parametrize("n", [1, 7, 100, 401, 1000])
@pytest.mark.parametrize("q", [50.0, 90.0, 99.0, 99.9])
def test_percentile_is_hdr_rank(n, q):
    values = lognormal(n, n, 50.0)
    hdr_ms = histogram(values).get_value_at_percentile(q) / 1000
    # HDR reports the top of the value's bucket: at most 1/1024 above it at 3 significant digits.
    assert (bootstrap.percentile(values, q) <= hdr_ms
            <= bootstrap.percentile(values, q) * (1 + 1 / 1024) + 1e-3)
    assert (bootstrap.rank(400, 99.0) == 396 and bootstrap.rank(28, 99.0) == 28
            and bootstrap.rank(5, 50.0) == 3)


@pytest.mark.parametrize("q", [50.0, 90.0])
def test_beta_shortcut_matches_brute_force_bootstrap(q):
    data = np.sort(lognormal(7, 25, 100.0))
    n, k = len(data), bootstrap.rank(25, q)
    rng = np.random.default_rng(0)
    brute = np.sort(rng.choice(data, size=(100_000, n), replace=True), axis=1)[:, k - 1]
    beta = bootstrap.percentile_draws(data, q, 100_000, np.random.default_rng(1))
    for j, x in enumerate(data, 1):
        exact = sum(math.comb(n, i) * (j / n) ** i * (1 - j / n) ** (n - i)
                    for i in range(k, n + 1))
        # P(k-th smallest <= x_(j)), by hand
        assert np.mean(beta <= x) == pytest.approx(exact, abs=0.006)
        assert np.mean(beta <= x) == pytest.approx(np.mean(brute <= x), abs=0.008)
    # The two 95% intervals land on the same order statistics, or neighbours at most.
    for a, b in zip(bootstrap.interval(beta, 0.95), bootstrap.interval(brute, 0.95), strict=True):
        assert abs(np.searchsorted(data, a) - np.searchsorted(data, b)) <= 1


def test_intervals_cover_as_often_as_claimed():
    rng = np.random.default_rng(3)
    covered = excludes_one = 0
    trials = 300
    for _ in range(trials):
        a, b = rng.lognormal(0.0, 1.0, 300), rng.lognormal(0.0, 1.0, 300)  # true median 1
        draws_a = bootstrap.percentile_draws(a, 50.0, 1000, rng)
        low, high = bootstrap.interval(draws_a, 0.95)
        covered += low <= 1.0 <= high
        ratio = bootstrap.ratio(bootstrap.percentile_draws(b, 50.0, 1000, rng), draws_a)
        excludes_one += (bootstrap.verdict(*bootstrap.interval(ratio, 0.95), lower_is_better=True)
                         != bootstrap.SAME)
    assert 0.90 <= covered / trials <= 0.99
    assert excludes_one / trials <= 0.10


def test_rate_draws_resample_bins():
    # Two 1 s bins with 1 and 3 requests: a resample holds both bins once (rate 2, p 1/2) or one bin
    # twice (rate 1 or 3, p 1/4 each).
    draws = bootstrap.rate_draws(np.array([1.0, 3.0]), np.array([1.0, 1.0]), 40_000,
                                 np.random.default_rng(0))
    assert set(np.unique(draws)) == {1.0, 2.0, 3.0}
    assert ([np.mean(draws == v) for v in (1.0, 2.0, 3.0)]
            == pytest.approx([0.25, 0.5, 0.25], abs=0.01))
    # Bins of unequal length: a ratio estimator, total count over total time.
    draws = bootstrap.rate_draws(np.array([2.0, 1.0]), np.array([1.0, 0.5]), 1000,
                                 np.random.default_rng(0))
    assert set(np.unique(draws)) == {2.0}


def test_verdict_and_ratio_edges():
    assert bootstrap.verdict(1.2, 1.5, lower_is_better=True) == "worse"
    assert bootstrap.verdict(1.2, 1.5, lower_is_better=False) == "better"
    assert bootstrap.verdict(0.5, 0.9, lower_is_better=True) == "better"
    assert bootstrap.verdict(0.9, 1.1, lower_is_better=True) == bootstrap.SAME
    assert bootstrap.ratio(np.array([0.0, 1.0]), np.array([0.0, 0.0])).tolist() == [1.0, math.inf]
    assert bootstrap.fmt_ratio(1.0) == "x1.00" and bootstrap.fmt_ratio(1.724) == "x1.72"


# --- compare on built run directories ---

def test_doubled_ttft_is_two_times_worse(tmp_path):
    ttft, tpot = lognormal(1, 400, 200.0), lognormal(2, 400, 20.0)
    write_run(tmp_path / "a", ttft, tpot)
    write_run(tmp_path / "b", 2 * ttft, tpot)
    _, headline = compare([load_run(tmp_path / "a"), load_run(tmp_path / "b")], tmp_path / "out")
    for key in ("ttft_p50_ms", "ttft_p99_ms"):
        b = by_run(headline, key)["b"]["vs_baseline"]
        assert b["ratio"] == pytest.approx(2.0, rel=0.002)  # each side within 1/1024 of its value
        assert b["ci"][0] > 1.0 and b["verdict"] == "worse"
        assert (b["text"].startswith(("x2.00 [", "x1.99 [", "x2.01 ["))
                and b["text"].endswith(", worse"))
        assert (headline["comparisons"][key]["best"] == "a"
                and headline["comparisons"][key]["significantly_best"])
    # The point estimates are the HDR rank's values: p50 the 200th smallest of 400, p99 the 396th.
    a = by_run(headline, "ttft_p99_ms")["a"]
    assert a["value"] == pytest.approx(np.sort(ttft)[395], rel=1 / 1024)
    assert a["ci"][0] <= a["value"] <= a["ci"][1]
    assert (by_run(headline, "ttft_p50_ms")["a"]["value"]
            == pytest.approx(np.sort(ttft)[199], rel=1 / 1024))
    # Identical TPOTs: ratio exactly 1, no significant difference.
    tpot_b = by_run(headline, "tpot_p50_ms")["b"]["vs_baseline"]
    assert tpot_b["ratio"] == 1.0 and tpot_b["verdict"] == bootstrap.SAME
    assert tpot_b["text"].startswith("no significant difference (x1.00 [")
    # With b as the baseline, a is twice as good.
    _, flipped = compare([load_run(tmp_path / "a"), load_run(tmp_path / "b")], tmp_path / "out",
                         baseline=1)
    assert (by_run(flipped, "ttft_p50_ms")["a"]["vs_baseline"]["ratio"]
            == pytest.approx(0.5, rel=0.002))
    assert by_run(flipped, "ttft_p50_ms")["a"]["vs_baseline"]["verdict"] == "better"


def test_same_distribution_is_no_significant_difference(tmp_path):
    for name, seed in (("one", 11), ("two", 12)):
        write_run(tmp_path / name, lognormal(seed, 500, 300.0), lognormal(seed + 100, 500, 25.0))
    done = run_cli(tmp_path / "one", tmp_path / "two", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    headline = full(done)
    for metric in METRICS:
        two = by_run(headline, metric.key)["two"]["vs_baseline"]
        assert two["verdict"] == bootstrap.SAME, (metric.key, two)
        assert two["ci"][0] <= 1 <= two["ci"][1]
        assert not headline["comparisons"][metric.key]["significantly_best"]
    assert "no significant difference (x" in done.stdout and headline["warnings"] == []
    assert set(headline) >= {"compare_md", "compare_png", "runs", "baseline", "comparisons"}


def test_throughput_and_goodput_point_estimates_by_hand(tmp_path):
    # Window: warm-up 2 s, then 10.5 s -> bins of 1 s and a last one of 0.5 s, [2000, 12500] ms.
    config = {"warmup_s": 2.0, "slo_ttft_ms": 500.0}
    rows = [
        # Completes inside, meets the SLO; 4 tokens in one message at completion (ttft = e2e).
        request_row(0, 300.0, None, 300.0, sent_ms=0, output_tokens=4)
        | {"scheduled_ms": 3000.0, "messages": 1},
        # Scheduled in the warm-up but completing in the window: counts for throughput,
        # meets the SLO.
        request_row(1, 400.0, None, 400.0, warmup=True, output_tokens=4)
        | {"scheduled_ms": 1800.0, "messages": 1},
        # Completes inside but misses the TTFT objective: tokens count, goodput does not.
        request_row(2, 900.0, None, 900.0, output_tokens=4)
        | {"scheduled_ms": 5000.0, "messages": 1},
        # Straddles the window's start: 11 one-token messages at 1550, 1650, ... 2550 ms; 6 land
        # inside; it ends inside and meets the SLO (TTFT 50 ms; TPOT 100 ms, no TPOT objective).
        request_row(3, 50.0, 100.0, 1050.0, output_tokens=11)
        | {"scheduled_ms": 1500.0, "messages": 11},
        # Completes after the window's end: messages at 12300, 12400, 12500 (inclusive), 12600
        # -> 3 inside.
        request_row(4, 300.0, 100.0, 600.0, output_tokens=4)
        | {"scheduled_ms": 12000.0, "messages": 4},
        # Failed: no tokens counted, no completion.
        request_row(5, None, None, None, status="UNAVAILABLE", output_tokens=0)
        | {"scheduled_ms": 6000.0},
    ]
    summary = {"window_s": 10.5,
               "throughput": {"window_s": 10.5, "output_tokens_per_s": (4 + 4 + 4 + 6 + 3) / 10.5,
                              "requests_per_s": 5 / 10.5, "goodput_requests_per_s": 3 / 10.5},
               "requests": {"sent": 6, "ok": 5, "failed": 1, "not_sent": 0,
                            "failed_by_code": {"UNAVAILABLE": 1}, "warmup": 0}}
    write_run(tmp_path / "r", [300.0, 900.0, 50.0, 300.0], [10.0] * 4, config=config, rows=rows,
              summary=summary)
    # The histograms hold what the measured OK rows do (two of them have no TPOT).
    hists = {"ttft": encoded([300.0, 900.0, 50.0, 300.0]), "tpot": encoded([100.0, 100.0]),
             "e2e": encoded([300.0, 900.0, 1050.0, 600.0])}
    (tmp_path / "r" / "histograms.json").write_text(json.dumps(hists))
    run = load_run(tmp_path / "r")
    edges = window_edges_ms(run)
    assert (edges[0] == 2000.0 and edges[-1] == 12500.0
            and np.diff(edges).tolist() == [1000.0] * 10 + [500.0])
    _, headline = compare([run], tmp_path / "out")
    tokens = by_run(headline, "output_tokens_per_s")["r"]
    good = by_run(headline, "goodput_requests_per_s")["r"]
    assert tokens["value"] == pytest.approx(21 / 10.5, rel=1e-9) and tokens["notes"] == []
    assert good["value"] == pytest.approx(3 / 10.5, rel=1e-9) and good["notes"] == []
    assert tokens["ci"][0] <= tokens["value"] <= tokens["ci"][1] and good["ci"][0] < good["ci"][1]
    # Four measured requests: percentiles come from the histograms, with no interval.
    assert (by_run(headline, "ttft_p50_ms")["r"]["no_interval"]
            == "too few requests for an interval (4)")


def test_workload_difference_is_warned_but_compared(tmp_path):
    write_run(tmp_path / "slow", lognormal(1, 50, 200.0), lognormal(2, 50, 20.0))
    write_run(tmp_path / "fast", lognormal(3, 50, 200.0), lognormal(4, 50, 20.0),
              config={"rate": 8.0, "seed": 3})
    done = run_cli(tmp_path / "slow", tmp_path / "fast", "--out", tmp_path / "out",
                   "--baseline", "fast")
    assert done.returncode == 0, done.stderr
    headline = full(done)
    assert headline["baseline"] == "fast"
    assert ([w.split(": ", 1)[1] for w in headline["warnings"]]
            == ["rate: slow=10.0, fast=8.0", "seed: slow=0, fast=3"])
    assert ("warning: the workloads differ" in done.stdout
            and "rate: slow=10.0, fast=8.0" in done.stdout)
    assert "**Warning:** the workloads differ" in (tmp_path / "out" / "compare.md").read_text()
    assert by_run(headline, "ttft_p50_ms")["slow"]["vs_baseline"]["verdict"] is not None


def test_too_few_requests_gives_point_estimate_only(tmp_path):
    write_run(tmp_path / "big", lognormal(1, 200, 200.0), lognormal(2, 200, 20.0))
    small = lognormal(3, 7, 200.0)
    write_run(tmp_path / "small", small, lognormal(4, 7, 20.0))
    text, headline = compare([load_run(tmp_path / "big"), load_run(tmp_path / "small")],
                             tmp_path / "out")
    for key in LATENCY:
        entry = by_run(headline, key)["small"]
        assert entry["value"] is not None and entry["ci"] is None
        assert entry["no_interval"] == "too few requests for an interval (7)"
        assert entry["vs_baseline"]["verdict"] is None
        assert entry["vs_baseline"]["text"].endswith(", no interval (too few requests for an "
                                                     "interval (7))")
    assert (by_run(headline, "ttft_p50_ms")["small"]["value"]
            == pytest.approx(np.sort(small)[3], rel=1 / 1024))
    assert "too few requests for an interval (7)" in text


def test_missing_or_truncated_rows_give_point_estimates_only(tmp_path):
    write_run(tmp_path / "full", lognormal(1, 100, 200.0), lognormal(2, 100, 20.0))
    write_run(tmp_path / "norows", lognormal(3, 100, 200.0), lognormal(4, 100, 20.0),
              summary={"throughput": {"window_s": 10.0, "output_tokens_per_s": 300.0,
                                      "requests_per_s": 9.5, "goodput_requests_per_s": 9.5}})
    (tmp_path / "norows" / "requests.jsonl").unlink()
    write_run(tmp_path / "capped", lognormal(5, 100, 200.0), lognormal(6, 100, 20.0),
              summary={"requests": {"sent": 150, "ok": 150, "failed": 0, "not_sent": 0,
                                    "failed_by_code": {}, "warmup": 0, "rows_omitted": 50}})
    runs = [load_run(tmp_path / name) for name in ("full", "norows", "capped")]
    _, headline = compare(runs, tmp_path / "out")
    norows = by_run(headline, "ttft_p99_ms")["norows"]
    capped = by_run(headline, "ttft_p99_ms")["capped"]
    assert (norows["no_interval"] == "requests.jsonl missing" and norows["ci"] is None
            and norows["value"] > 0)
    assert (capped["no_interval"] == ("requests.jsonl holds 100 of the 150 requests "
                                      "(50 past --max-request-rows): point estimate only")
            and capped["ci"] is None)
    # Without rows, the rates are summary.json's.
    assert by_run(headline, "output_tokens_per_s")["norows"]["value"] == 300.0
    assert by_run(headline, "goodput_requests_per_s")["norows"]["vs_baseline"]["verdict"] is None


@pytest.mark.parametrize("kept", [16, 0])
def test_cut_short_rows_give_point_estimates_only(tmp_path, kept):
    # A requests.jsonl cut short after the run (summary.json says nothing was omitted): a bootstrap
    # over the rows left would give intervals about another sample, and rates rebuilt from them
    # would be too low.
    ttft, tpot = lognormal(1, 100, 200.0), lognormal(2, 100, 20.0)
    write_run(tmp_path / "full", ttft, tpot)
    rates = {"window_s": 10.0, "output_tokens_per_s": 320.0, "requests_per_s": 10.0,
             "goodput_requests_per_s": 10.0}
    write_run(tmp_path / "cut", ttft, tpot, summary={"throughput": rates})
    rows = (tmp_path / "cut" / "requests.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "cut" / "requests.jsonl").write_text("".join(rows[:kept]))
    text, headline = compare([load_run(tmp_path / "full"), load_run(tmp_path / "cut")],
                             tmp_path / "out")
    why = f"requests.jsonl holds {kept} of the 100 requests: point estimate only"
    for metric in METRICS:
        cut = by_run(headline, metric.key)["cut"]
        assert cut["ci"] is None and cut["no_interval"] == why, metric.key
        assert (cut["vs_baseline"]["verdict"] is None
                and cut["vs_baseline"]["text"].endswith(f"no interval ({why})"))
        assert not headline["comparisons"][metric.key]["significantly_best"]
        if metric.q is None:  # the rates fall back to summary.json's
            assert cut["value"] == rates[metric.key] and cut["notes"] == []
        else:  # the percentiles are the histograms', as for the full run
            assert cut["value"] == by_run(headline, metric.key)["full"]["value"]
    assert why in text


def test_rows_unlike_the_histograms_give_point_estimates_only(tmp_path):
    write_run(tmp_path / "full", lognormal(1, 100, 200.0), lognormal(2, 100, 20.0))
    write_run(tmp_path / "odd", lognormal(3, 100, 200.0), lognormal(4, 100, 20.0))
    # Rows for every request sent, but ten of the measured OK ones lost their TTFT.
    rows = [json.loads(line)
            for line in (tmp_path / "odd" / "requests.jsonl").read_text().splitlines()]
    write_rows(tmp_path / "odd" / "requests.jsonl",
               [r | {"ttft_ms": None} for r in rows[:10]] + rows[10:])
    _, headline = compare([load_run(tmp_path / "full"), load_run(tmp_path / "odd")],
                          tmp_path / "out")
    odd = by_run(headline, "tpot_p50_ms")["odd"]
    assert odd["ci"] is None
    assert odd["no_interval"] == ("requests.jsonl holds 90 measured ttft values, "
                                  "histograms.json 100: point estimate only")


def test_different_slos_give_no_goodput_verdict(tmp_path):
    ttft, tpot = lognormal(1, 200, 200.0), lognormal(2, 200, 20.0)
    write_run(tmp_path / "strict", ttft, tpot, config={"slo_ttft_ms": 150.0})
    write_run(tmp_path / "loose", ttft, tpot, config={"slo_ttft_ms": 150.0, "slo_e2e_ms": 5000.0})
    text, headline = compare([load_run(tmp_path / "strict"), load_run(tmp_path / "loose")],
                             tmp_path / "out")
    goodput = headline["comparisons"]["goodput_requests_per_s"]
    loose = by_run(headline, "goodput_requests_per_s")["loose"]
    assert loose["vs_baseline"] == {"ratio": None, "ci": None, "verdict": None,
                                    "text": "not compared (the runs used different SLOs)"}
    assert loose["ci"] is not None  # each run keeps its own figure and interval
    assert goodput["best"] is None and not goodput["significantly_best"]
    assert goodput["best_text"] == "not compared (the runs used different SLOs)"
    assert ("goodput: the runs used different SLOs (strict: TTFT <= 150 ms; loose: TTFT <= 150 ms "
            "and E2E <= 5000 ms), so their goodput is not compared") in text
    # The other metrics are judged as usual.
    assert by_run(headline, "ttft_p50_ms")["loose"]["vs_baseline"]["verdict"] == bootstrap.SAME
    # The same SLOs, E2E included: goodput is compared.
    write_run(tmp_path / "same", ttft, tpot, config={"slo_ttft_ms": 150.0, "slo_e2e_ms": 5000.0})
    text, headline = compare([load_run(tmp_path / "loose"), load_run(tmp_path / "same")],
                             tmp_path / "out")
    assert (by_run(headline, "goodput_requests_per_s")["same"]["vs_baseline"]["verdict"]
            == bootstrap.SAME)
    assert "goodput: requests/s meeting TTFT <= 150 ms and E2E <= 5000 ms" in text


def test_runs_that_held_no_work_back_are_same_plans_not_better_or_worse(tmp_path):
    ttft, tpot = lognormal(1, 400, 200.0), lognormal(2, 400, 20.0)
    snapshot = {"policy": "fcfs", "steps": 0, "plans_held_back": 0}

    def server(policy: str, held: int) -> dict:
        return {"start": snapshot | {"policy": policy},
                "end": snapshot | {"policy": policy, "steps": 900, "plans_held_back": held}}

    runs = {"fcfs": server("fcfs", 0), "expert_aware": server("expert_aware", 0),
            "static": server("static", 40), "older": server("dynamic", 0)}
    for name, srv in runs.items():
        write_run(tmp_path / name, 2 * ttft if name != "fcfs" else ttft, tpot,
                  summary={"server": srv})
    # a run directory written before the server counted them: unknown, not none
    older = tmp_path / "older" / "summary.json"
    older.write_text(older.read_text().replace(', "plans_held_back": 0', ""))
    done = run_cli(*(tmp_path / name for name in runs), "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    headline = full(done)
    held = {r["run"]: r["plans_held_back"] for r in headline["runs"]}
    assert held == {"fcfs": 0, "expert_aware": 0, "static": 40, "older": None}
    against = {name: r["vs_baseline"] for name, r in by_run(headline, "ttft_p50_ms").items()}
    # twice the TTFT, but neither run held work back: the same plans, so not the policy's
    assert against["expert_aware"]["verdict"] == "same plans"
    assert against["expert_aware"]["text"].startswith("same plans as fcfs (x2.0")
    assert against["static"]["verdict"] == against["older"]["verdict"] == "worse"
    assert "expert_aware" not in json.dumps(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "fcfs and expert_aware held no work back" in done.stdout
    assert "**Same plans.** fcfs and expert_aware" in (tmp_path / "out" / "compare.md").read_text()


def test_server_difference_is_warned_but_compared(tmp_path):
    settings = {"preset": "small", "device": "cpu", "dtype": "float32", "max_batch_size": 8,
                "kv_slots_total": 12, "router": "topk", "routing_skew": "affinity:0.1",
                "capacity_factor": 0.0, "moe_kernel": "sorted", "expert_cache": 0,
                "cache_policy": "lru"}
    servers = {"fcfs": {"start": settings | {"policy": "fcfs",
                                             "policy_knobs": {}}},  # no end snapshot: the start's
               "static": {"start": settings | {"max_batch_size": 4},
                          "end": settings | {"policy": "static",
                                             "policy_knobs": {"max_wait_ms": 100},
                                             "max_batch_size": 32, "routing_skew": "uniform"}},
               "bare": {}}  # a run without GetStats snapshots is left out of the server comparison
    for i, (name, server) in enumerate(servers.items()):
        write_run(tmp_path / name, lognormal(i, 50, 200.0), lognormal(i + 9, 50, 20.0),
                  summary={"server": server})
    done = run_cli(*(tmp_path / name for name in servers), "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    headline = full(done)
    assert headline["warnings"] == [
        "the servers differ, so the comparison mixes server settings and policy: "
        "max_batch_size: fcfs=8, static=32",
        "the servers differ, so the comparison mixes server settings and policy: "
        "routing_skew: fcfs=affinity:0.1, static=uniform"]
    assert "warning: the servers differ" in done.stdout
    assert "**Warning:** the servers differ" in (tmp_path / "out" / "compare.md").read_text()
    assert by_run(headline, "ttft_p50_ms")["static"]["vs_baseline"]["verdict"] is not None


def test_servers_reporting_their_settings_are_compared_on_every_setting_that_matters(tmp_path):
    def server(policy: str, threads: str, max_wait_ms: str) -> dict:
        settings = {"policy": policy, "preset": "small", "torch_threads": threads,
                    "max_wait_ms": max_wait_ms, "port": str(50051 + len(policy))}
        return {"start": {"settings": settings}}

    for i, (name, args) in enumerate({"a": ("fcfs", "1", "50.0"),
                                      "b": ("static", "2", "100.0")}.items()):
        write_run(tmp_path / name, lognormal(i, 50, 200.0), lognormal(i + 9, 50, 20.0),
                  summary={"server": server(*args)})
    _, headline = compare([load_run(tmp_path / "a"), load_run(tmp_path / "b")], tmp_path / "out")
    # The policy and its knobs differ by design, the port does not matter: torch threads do.
    assert headline["warnings"] == [
        "the servers differ, so the comparison mixes server settings and policy: "
        "torch_threads: a=1, b=2"]


def test_png_has_expected_size_and_md_links_it(tmp_path):
    for name, seed in (("x", 1), ("y", 2), ("z", 3)):
        write_run(tmp_path / name, lognormal(seed, 60, 200.0), lognormal(seed + 9, 60, 20.0))
    compare([load_run(tmp_path / n) for n in "xyz"], tmp_path / "out")
    width, height = png_size(tmp_path / "out" / "compare.png")
    assert (width, height) == (1600, 800)
    assert "![comparison](compare.png)" in (tmp_path / "out" / "compare.md").read_text()


def test_bad_input_exits_2_naming_file_or_flag(tmp_path):
    write_run(tmp_path / "a", lognormal(1, 20, 200.0), lognormal(2, 20, 20.0))
    write_run(tmp_path / "b", lognormal(3, 20, 200.0), lognormal(4, 20, 20.0))
    (tmp_path / "b" / "summary.json").unlink()
    done = run_cli(tmp_path / "a", tmp_path / "b", "--out", tmp_path / "out")
    assert done.returncode == 2 and str(tmp_path / "b" / "summary.json") in done.stderr
    assert "Traceback" not in done.stderr
    for flags, named in ((["--baseline", "nope"], "--baseline"),
                         (["--confidence", "1.5"], "--confidence"),
                         (["--resamples", "5"], "--resamples")):
        done = run_cli(tmp_path / "a", *flags, "--out", tmp_path / "out")
        assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr


def full(done) -> dict:
    """compare.json, named by the short headline compare prints last."""
    return json.loads(Path(json.loads(done.stdout.strip().splitlines()[-1])["compare_json"])
                      .read_text())
