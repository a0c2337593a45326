# One place for the project's checks. `make check` = lint + types + generated-file drift;
# `make test` = the README's test command.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup lint typecheck generate drift check test

setup:
	bash scripts/setup.sh

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check stagelens instrumentation exporters dashboards

typecheck:
	bash scripts/typecheck.sh

generate:
	$(PY) -m stagelens.cli slo render --out alerts
	$(PY) -m stagelens.dashboards.build --out dashboards
	$(PY) -m stagelens.dashboards.deploy --out deploy
	$(PY) -m stagelens.views.telemetry_docs --out docs/telemetry.md
	$(PY) -m stagelens.views.settings_docs --update docs/instrumenting.md

drift: generate
	git diff --exit-code -- dashboards alerts deploy docs/telemetry.md docs/instrumenting.md

check: lint typecheck drift

test:
	$(VENV)/bin/pytest
