"""The reports' figures, one module each: latency CDFs, the TTFT split, expert load, the stress
curve, figures over the run's time."""
