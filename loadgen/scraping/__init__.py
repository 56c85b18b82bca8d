"""The server side of a run: scraping the target's Prometheus endpoints (and this host's GPUs
through NVML) beside the load, in a process of its own, into server_metrics.jsonl."""
