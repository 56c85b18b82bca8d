"""The files of a run directory (docs/run-directory.md): the interface between the load
generator, which writes them, and the analysis, which reads them."""

SUMMARY = "summary.json"  # records/summary.py
HISTOGRAMS = "histograms.json"  # metric name -> encoded HdrHistogram of integer microseconds
REQUESTS = "requests.jsonl"  # records/requests.py, one per line
SAMPLES = "server_stats.jsonl"  # records/server_stats.py ServerSample, one per line
SERVER_METRICS = "server_metrics.jsonl"  # records/server_metrics.py Scrape, one per line
STEPS = "steps.csv"  # stress mode: records/summary.py StepRow, one per row
WORKERS = "workers.json"  # distributed runs: each worker's own histograms and counts
HLOG = "{metric}.hlog"  # HdrHistogram interval log of one client metric
WORKER_DIR = "worker-{rank}"  # a distributed run's worker's own interval logs and samples
ROUTED = "routed_experts.jsonl"  # records/expert_routes.py: a RoutedRow a line (--routed-experts)
EXPERT_RECORDS = "expert_records"  # engines' own expert statistics (SGLang's recorder, TRT-LLM's)
