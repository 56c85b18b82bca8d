"""Reading a run directory: its files checked against their records, the interval logs, the
request rows, the GetStats snapshots and the latency statistics drawn from the histograms."""
