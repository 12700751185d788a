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

test: setup
	$(BIN)/python -m pytest -q

bench-binpack: setup
	$(BIN)/python -m benchmarks.binpack

bench-latency: setup
	$(BIN)/python -m benchmarks.latency

clean:
	rm -rf $(VENV) results
