"""The diagnosis's rules (seed 5.3), one concept per module, each returning a Finding: failures,
fault rehearsals, saturation, latency spikes, who is late, expert parallelism."""
