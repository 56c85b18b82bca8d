"""Recording a run: per-request timing, HDR histograms, interval logs, the generator's own
lateness, the summary and the run directory's files."""
