# llm-operator: every entry point a developer or CI needs. Targets install what they use.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
export LLMOP_CACHE ?= $(HOME)/.cache/llm-operator

.PHONY: help venv tools images cluster-up cluster-down operator-up demo test test-unit test-e2e lint crds bench clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

venv: ## create/reuse the Python environment (cached outside the repo, keyed by the lock file)
	@scripts/ensure-venv.sh

tools: ## build/reuse every test-world binary (Go, cached by version; BUILD_GROUPS="core monitoring" for some): e2e/cluster/build-tools.sh
	@e2e/cluster/build-tools.sh $(BUILD_GROUPS) >/dev/null

images: venv ## build/reuse the OCI image archives without Docker (root), push them with crane to REGISTRY=host/path (default: the test world's registry)
	@e2e/cluster/build-tools.sh crane >/dev/null
	@$(PY) -m images.builder --all
	@$(PY) -m images.push $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(VERSION),--version $(VERSION))

cluster-up: venv ## start the embedded cluster (control plane, GPU node pools, a real node); ADDONS="monitoring ..." or all adds add-ons
	@$(PY) -m e2e.cluster up $(if $(ADDONS),--with $(ADDONS))

cluster-down: venv ## stop the embedded cluster (and the operator installed in it), remove its state
	@$(PY) -m e2e.cluster down

operator-up: venv ## install/upgrade the operator in the running cluster from the Helm chart, local images
	@$(PY) -m e2e.operator_release up

crds: venv ## regenerate crds/ and the chart's CRD from the pydantic API models
	@$(PY) -m llm_operator.api.crd --write

lint: venv ## ruff (lint + format check) and mypy --strict; helm lint runs in tests/unit/test_chart.py
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check .
	@$(PY) -m mypy

demo: ## local cluster, the operator (chart), sample LLMDeployments, the openai SDK streaming, a canary, autoscaling, routing
	@export LLMOP_DEMO_START=$$EPOCHREALTIME; scripts/ensure-venv.sh && scripts/demo.sh

test: venv tools ## every test: lint, then the e2e tier on the embedded cluster beside unit, Triton on CPU, images and gitops
	@$(MAKE) --no-print-directory lint
	@scripts/test.sh

test-unit: venv ## pure tests only (no cluster, no Triton)
	@$(PY) -m pytest -p no:cacheprovider -m "not e2e and not triton and not images"

bench: venv ## operator, planner and serving benchmarks (figures and ratios printed; P9 installs aiperf apart: scripts/ensure-tool-venv.sh bench)
	@$(PY) -m bench $(BENCH_ARGS)

clean: ## remove local state (keeps the caches outside the repo)
	-@$(PY) -m e2e.cluster down 2>/dev/null
	rm -rf .cluster .pytest_cache .mypy_cache .ruff_cache
