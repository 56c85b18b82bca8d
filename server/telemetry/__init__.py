"""Engine telemetry as the server keeps it: each window's counters and histograms (declared in
records/engine_telemetry.py), the exchanges between ranks, the process's CPU, memory and GPU, and
the per-step log."""
