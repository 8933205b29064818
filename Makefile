# The two set-up commands: `make run` starts the whole product, `make test` runs ruff and the test suite.
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: run test install db lint bench load clean-model

install:
	@scripts/install.sh

db: install
	@scripts/createdb.sh
	$(VENV)/python manage.py migrate --noinput
	$(VENV)/python manage.py bootstrap

run: db
	$(VENV)/python manage.py prepare_model
	$(VENV)/python manage.py collectstatic --noinput -v0
	$(VENV)/honcho start -f Procfile

lint: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

test: install
	@scripts/test.sh $(ARGS)

bench: install
	$(VENV)/python -m devtools.bench
