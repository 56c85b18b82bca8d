# moe-loadlab: every target installs what it needs first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTO_OUT := proto/moe_pb2.py proto/moe_pb2_grpc.py

PRESET ?= small
PORT ?= 50051
DEMO_POLICIES ?= fcfs
DEMO_PRESET ?= small
DEMO_RUN_S ?= 30
DEMO_RATE ?= 2
DEMO_DIR ?= runs/demo

.PHONY: install proto serve load demo test bench-engine bench lint clean

install: $(STAMP) $(PROTO_OUT)

# torch first and pinned: here it resolves to a local CPU wheel; pyproject keeps torch>=2.5
# so a GPU machine installing the project itself gets CUDA.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

proto: $(PROTO_OUT)

$(PROTO_OUT): proto/moe.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. proto/moe.proto

serve: install
	$(PY) -m server --preset $(PRESET) --port $(PORT)

load: install
	$(VENV)/bin/locust -f loadgen/moe.py --host 127.0.0.1:$(PORT)

# One server per policy on a free port, a short open-loop run against it, a report per run.
demo: install
	@set -eu; rm -rf $(DEMO_DIR); mkdir -p $(DEMO_DIR); status=0; \
	for policy in $(DEMO_POLICIES); do \
	  run=$(DEMO_DIR)/$$policy; mkdir -p $$run; \
	  echo "== $$policy: serving preset $(DEMO_PRESET)"; \
	  $(PY) -m server --preset $(DEMO_PRESET) --policy $$policy --port 0 \
	    --port-file $$run/server.port >$$run/server.log 2>&1 & pid=$$!; \
	  trap "kill $$pid 2>/dev/null" EXIT; \
	  for i in $$(seq 600); do [ -s $$run/server.port ] && break; \
	    kill -0 $$pid 2>/dev/null || { cat $$run/server.log; exit 1; }; sleep 0.1; done; \
	  [ -s $$run/server.port ] || { echo "server did not start: see $$run/server.log"; exit 1; }; \
	  $(VENV)/bin/locust -f loadgen/moe.py --host 127.0.0.1:$$(cat $$run/server.port) \
	    --headless --only-summary -t $(DEMO_RUN_S)s --mode fixed --rate $(DEMO_RATE) \
	    --prompt-tokens 64 --max-tokens 32 --warmup-s 5 --run-dir $$run || status=$$?; \
	  kill -TERM $$pid; wait $$pid; trap - EXIT; \
	  $(PY) -m analysis report $$run; \
	done; \
	[ $$status -eq 0 ] || echo "some requests failed (locust exit $$status): see the reports above"; exit $$status

# pytest exits 5 when it collects no test; that is not a failure of the suite.
test: install
	$(PY) -m pytest -q; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

bench-engine: install
	$(PY) -m server.bench_engine

bench: bench-engine

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(PROTO_OUT) proto/moe_pb2.pyi runs
