# Brakeline: `make demo` and `make test` are the quick start; both set themselves up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The test suite runs on real services (PostgreSQL, Redis), never on SQLite by mistake.
# Its own Redis database number and channel prefix keep a development worker from
# stealing test tasks.
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/brakeline
TEST_REDIS_URL ?= redis://127.0.0.1:6379/10
# Two suites on one machine (two clones) keep apart by giving each its own of these four.
TEST_CHANNEL_PREFIX ?= brakeline-test
TEST_CELERY_QUEUE ?= brakeline-test
TEST_ENV := DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) \
	BRAKELINE_CHANNEL_PREFIX=$(TEST_CHANNEL_PREFIX) BRAKELINE_CELERY_QUEUE=$(TEST_CELERY_QUEUE) \
	BRAKELINE_SECRET_KEY=brakeline-test-only-secret-key-not-for-any-deployment \
	BRAKELINE_NOTIFY_ALLOW_PRIVATE_URLS=true BRAKELINE_DRILL_SCHEDULE=false
PYTEST_ARGS ?=
# Options of `manage.py demo`, e.g. make demo DEMO_ARGS="--port 8001" (--host, --simulator...).
DEMO_ARGS ?=

.PHONY: install demo test lint bench bench-fleet bench-scaleout bench-ranks clean faults

# Two distributions, both editable: the SDK (sdk/, `brakeline`) and the console with its test
# dependencies (`brakeline-console[dev]`).
$(STAMP): pyproject.toml sdk/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e './sdk[ws]' -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	env -u DATABASE_URL -u REDIS_URL $(BIN)/python manage.py migrate --verbosity 0
	env -u DATABASE_URL -u REDIS_URL $(BIN)/python manage.py demo $(DEMO_ARGS)

test: install
	$(TEST_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS)

# Only the fault suite's CI-sized variant (tests/faults, part of `make test` too): its own
# PostgreSQL, Redis and console, killed and restarted under load.
faults: install
	$(TEST_ENV) $(BIN)/python -m pytest tests/faults $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# Benchmarks print their figures (medians, ratios to a baseline measured in the same run).
bench: install
	cd bench && $(TEST_ENV) ../$(BIN)/python ingest.py
	cd bench && $(TEST_ENV) ../$(BIN)/python agent_path.py
	cd bench && $(TEST_ENV) ../$(BIN)/python bundle_cost.py
	cd bench && $(TEST_ENV) ../$(BIN)/python detectors.py
	cd bench && $(TEST_ENV) ../$(BIN)/python evaluation.py
	cd bench && $(TEST_ENV) ../$(BIN)/python brake.py
	cd bench && $(TEST_ENV) ../$(BIN)/python page.py
	cd bench && $(TEST_ENV) ../$(BIN)/python ranks_console.py
	cd bench && $(TEST_ENV) ../$(BIN)/python storage.py
	cd bench && $(TEST_ENV) ../$(BIN)/python sdk_overhead.py
	cd bench && $(TEST_ENV) ../$(BIN)/python guard.py
	cd bench && ../$(BIN)/python ranks_agreement.py
	cd bench && ../$(BIN)/python faults.py

# The fleet simulator: one job of N simulated ranks at the SDK's defaults against the
# production stack; FLEET_ARGS="--ranks 100,200 --rounds 3" (docs in bench/fleet.py).
FLEET_ARGS ?=
bench-fleet: install
	cd bench && $(TEST_ENV) ../$(BIN)/python fleet.py $(FLEET_ARGS)

# Scale-out, run: N Daphnes behind the shipped HAProxy config and M workers, one node-mode job;
# SCALEOUT_ARGS="--configs 1x1,2x2 --ranks 400" (docs in bench/scaleout.py).
SCALEOUT_ARGS ?=
bench-scaleout: install
	cd bench && $(TEST_ENV) ../$(BIN)/python scaleout.py $(SCALEOUT_ARGS)

# The console at 1,000 ranks: each page's server time and size against a 2-rank job.
bench-ranks: install
	cd bench && $(TEST_ENV) ../$(BIN)/python ranks_console.py

clean:
	rm -rf $(VENV) var
