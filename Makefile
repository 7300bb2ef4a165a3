# Front doors: `make demo` (set up, then run a learning run on one machine) and `make test`.
VENV        ?= .venv
BIN         := $(VENV)/bin
# The Kafka installation the tests and the demo use; ../shared/kafka holds Apache Kafka 4.4.0.
KAFKA_HOME  ?= $(if $(wildcard ../shared/kafka/libs),$(abspath ../shared/kafka),)
export KAFKA_HOME
PYTEST_ARGS ?=
DURATION    ?= 0

.PHONY: setup test test-cluster unit demo bench bench-quick lint format clean

setup:
	@bash scripts/setup.sh

# Everything but the whole run on a 3-node cluster (minutes of three JVMs beside vLLM): `make test-cluster` runs it.
test: setup
	$(BIN)/pytest -m "not cluster" --durations=30 $(PYTEST_ARGS)

test-cluster: setup
	$(BIN)/pytest -m cluster $(PYTEST_ARGS)

unit: setup
	$(BIN)/pytest -m "not kafka and not vllm and not browser and not slow" $(PYTEST_ARGS)

demo: setup
	$(BIN)/distrl-stream up --duration $(DURATION)

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Quick runs write bench/results/quick/ (git-ignored): the committed full results stay as the docs cite them.
bench-quick: setup
	@for b in bench/*.py; do echo "== $$b --quick"; $(BIN)/python $$b --quick || exit 1; done

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf distrl-data .pytest_cache build *.egg-info
