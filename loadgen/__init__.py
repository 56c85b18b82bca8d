"""The load generator: `locust -f loadgen/moe.py`. Only moe.py imports locust."""
