# The two commands of the README: `make demo` (main job, embedded cluster) and `make test`.
# Both create .venv and install the project and its test tools first, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup protos bench-binpack bench-latency clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) protos

# gRPC stubs are generated from the .proto files kept in the repo (reproducible build step).
protos: $(STAMP)
	$(BIN)/python -m stowage.genprotos

demo: setup
	$(BIN)/stowage demo

# Two pytest runs, both always run, either failing fails: first the real-peer tests alone (one
# control plane per session; they time the kubelet's and kube-scheduler's reactions, and most of
# their wall time is waiting on those peers, so nothing else competes for the cores), then all the
# other tests spread over worker processes (pytest-xdist, one per core, at most 4).
TEST_WORKERS ?= auto

test: setup
	@rc=0; \
	$(BIN)/python -m pytest -q tests/integration || rc=$$?; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --ignore=tests/integration || rc=$$?; \
	exit $$rc

bench-binpack: setup
	$(BIN)/python -m benchmarks.binpack

bench-latency: setup
	$(BIN)/python -m benchmarks.latency

clean:
	rm -rf $(VENV) results
