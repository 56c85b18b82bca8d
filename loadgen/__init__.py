"""The load generator: `locust -f loadgen/moe.py`. Only moe.py and listener.py import locust."""
