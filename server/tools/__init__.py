"""The server's benchmarks and checks, each run by a Makefile target: make bench-engine, the
reference MoE block it compares against, make gpu-check."""
