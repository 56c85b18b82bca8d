"""Soak: does a long run drift? p99 TTFT and p99 TPOT, server RSS and queue depth per window,
each with an ordinary least squares trend over time, its 95% confidence interval and a verdict.

Windows: --window-s of the run after its warm-up (the last window stretches to the run's end,
so no data is left out). A window's p99 comes from its interval histograms added together
(exact HDR add; never averaged percentiles); one with fewer than --min-samples requests is
skipped and counted. RSS and queue depth are the mean of the GetStats samples in the window.
Where the server's /metrics was scraped (server_metrics.jsonl, any target), its KV-cache usage,
its preemptions per minute and, where GetStats gives none, its RSS are followed the same way.

A fault rehearsal (the server's --fault-window, seen open in the GetStats samples) is left out
of the latency series: its seconds and a window's length after, where the server recovers; a
window keeps its other seconds, and is left out only where none is left.
The load generator's RSS (server_stats.jsonl's generator_rss_bytes) is followed from the
window after requests.jsonl's row cap filled: until then it grows with the rows kept, by design
(a run whose cap never filled leaves every window out).
With summary.json, the run's accounting is checked: sent = ok + failed + cancelled.

Verdict per series: "drift" when the slope's 95% CI (Student t, n - 2 degrees of freedom)
excludes 0 AND the fitted change over the run exceeds --min-change of the fitted starting
level (of the series mean where that start is not above 0), or when the slope continued over
the deployment horizon (--horizon-h) rises past the series' budget even at the CI's slow end
(--budget-mb for RSS, --budget-ms for p99 latency, --budget-requests for queue depth: a soak
of minutes cannot otherwise call a leak that matters after days). "cannot judge" when it is
not drift but the CI's fast end, continued over the horizon, rises past the budget: the run
cannot tell drift from none against it (the verdict says about how much longer a soak would
tell); and for a series with fewer than 3 usable windows (too few requests, or left out for a
fault rehearsal). Otherwise "no drift"; "no data" where it was not measured at all. Each
verdict says what the slope and its CI amount to over the horizon, beside the starting level
and the budget. A fitted level below 0 (a fall steep enough to cross 0 by the run's end) is
held at 0 and said. A run shorter than 3 windows exits 2, as does a
--window-s shorter than the run's logging interval (its config interval_s, 1 s when absent).
"""
