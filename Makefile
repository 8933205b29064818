# The two set-up commands: `make run` starts the whole product, `make test` runs ruff and the test suite.
SHELL := /bin/bash
VENV := .venv/bin

.PHONY: run run-vllm test test-vllm test-cluster install install-vllm db lint bench load clean-model

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

# vLLM backend (docs/serving-backends.md): its own virtualenv, a worker served by vLLM, its test layer.
install-vllm:
	@scripts/install_vllm.sh

run-vllm: db install-vllm
	$(VENV)/python manage.py prepare_model
	$(VENV)/python manage.py collectstatic --noinput -v0
	$(VENV)/honcho start -f Procfile.vllm

test-vllm: install install-vllm
	@scripts/test_vllm.sh $(ARGS)

lint: install
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

test: install
	@scripts/test.sh $(ARGS)

# The multi-host test bed's drills and the container image's build and run (network namespaces, podman;
# needs root; .ci/run calls it after test and test-vllm): docs/scale-out.md
test-cluster: install
	@scripts/test-cluster.sh $(ARGS)

bench: install
	$(VENV)/python -m devtools.bench
