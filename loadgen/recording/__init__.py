"""Recording a run: per-request timing, the service-level objectives it is judged by, HDR
histograms, interval logs, the generator's own lateness, the summary and the run directory's
files."""
