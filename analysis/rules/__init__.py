"""The diagnosis's rules, one concept per module, each returning a Finding
(finding.py): failures, fault rehearsals, saturation, expert load and weight movement, latency
spikes, who is late (the generator, the server's writes), expert parallelism's exchanges."""
