# ctr-pipeline — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
DATA   ?= artifacts/data/train.txt
RUN    ?= artifacts/run
REPO   ?= artifacts/models/ctr
ROWS   ?= 1000000
ARGS   ?=
TUNE   ?= artifacts/tune
TRIALS ?= 20
TUNE_ROWS ?= 200000

.PHONY: help install flink-venv sysdeps run data train tune day online-demo rollout-demo export serve test test-slow coverage test-gpu test-containers soak lint fmt bench bench-guard bench-http bench-compare clean fuzz

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

# One venv for every stage. torch==2.13.0 goes first (the CPU wheel on disk; a bare `torch`
# would pull a multi-GB CUDA build), then tensorflow (not tensorflow-cpu), then the project.
$(STAMP): pyproject.toml setup.py ctr_features/compiled/_table_native.c ctr_features/compiled/raw_key.h serving/codecs/_scan_native.c
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q 'tensorflow>=2.21,<2.22'
	$(PIP) install -q -e '.[train,export,serve,tracing,bench,tune,dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install every stage (skipped when done)

# The Flink click join's own venv (pipelines/clicks/flink/, docs/flink-join.md): apache-flink and its Java 17
# (sysdeps). The main venv has no pyflink: the join runs there as a subprocess.
FLINK_VENV  ?= .venv-flink
FLINK_STAMP := $(FLINK_VENV)/.installed
$(FLINK_STAMP):
	test -x $(FLINK_VENV)/bin/python || python3 -m venv $(FLINK_VENV)
	$(FLINK_VENV)/bin/pip install -q --upgrade pip
	$(FLINK_VENV)/bin/pip install -q 'apache-flink==2.3.*'
	touch $(FLINK_STAMP)

flink-venv: sysdeps $(FLINK_STAMP) ## The Flink join's venv (.venv-flink: apache-flink 2.3, Java 17 from sysdeps)

sysdeps: ## Install the Debian tools the tests and benchmarks use (prometheus, promtool, wrk, docker-compose, strace, Java 17 for TorchServe and Flink)
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v wrk >/dev/null || ! command -v docker-compose >/dev/null || ! command -v strace >/dev/null || ! command -v java >/dev/null || ! ls /usr/lib/jvm/java-17-openjdk-*/bin/java >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus wrk docker-compose strace openjdk-17-jre-headless >/dev/null; \
	  else echo "sysdeps: run 'sudo make sysdeps' to install prometheus, wrk, docker-compose, strace and java (TorchServe)"; fi; fi

$(DATA): | $(STAMP)
	$(PY) -m training.synth --out $(DATA) --rows $(ROWS) --seed 7

data: $(DATA) ## Generate the built-in synthetic Criteo-format data set (if absent)

train: $(STAMP) $(DATA) ## Train the CTR model on the default data (generated if absent)
	$(PY) -m training --data $(DATA) --out $(RUN) $(ARGS)

tune: $(STAMP) $(DATA) ## Optuna search (lr, batch, dropout, weight decay, activation): make tune TRIALS=20 -> artifacts/tune/best.json
	$(PY) -m training.tune --data $(DATA) --trials $(TRIALS) --max-rows $(TUNE_ROWS) --out $(TUNE) $(ARGS)

day: $(STAMP) ## One day of the daily loop: make day N=1 (day N's data, warm start, export through the gate)
	REPO=$(REPO) scripts/daily.sh $(or $(N),0)

online-demo: $(STAMP) ## Online learning for ~5 min: server + simulator + online trainer; report in OUT (artifacts/online-demo)
	$(PY) -m pipelines.demos.online --out $(or $(OUT),artifacts/online-demo) $(ARGS)

rollout-demo: $(STAMP) ## Safe rollout for ~2 min: server, simulator, live evaluation, controller; a good version promoted, a bad one rolled back; report in OUT (artifacts/rollout-demo)
	$(PY) -m pipelines.demos.rollout --out $(or $(OUT),artifacts/rollout-demo) $(ARGS)

export: $(STAMP) ## Export the best checkpoint into the versioned model repository (REPO: a folder, or s3://BUCKET/PREFIX)
	$(PY) -m export --run $(RUN) --repo $(REPO) $(ARGS)

serve: $(STAMP) ## Serve the model repository (REST :8501, gRPC :8500)
	$(PY) -m serving --port=8500 --rest_api_port=8501 --model_name=ctr --model_base_path=$(REPO) $(ARGS)

run: $(STAMP) $(DATA) ## The whole pipeline on built-in data: data, train, export, serve
	$(PY) -m training --data $(DATA) --out $(RUN)
	$(PY) -m export --run $(RUN) --repo $(REPO)
	$(PY) -m serving --port=8500 --rest_api_port=8501 --model_name=ctr --model_base_path=$(REPO) --print_curl_example

lint: $(STAMP) ## ruff + mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy ctr_contract ctr_store ctr_features ctr_model training export serving pipelines bench

fmt: $(STAMP) ## Format the code with ruff
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The tiers (docs/testing.md): `test` holds the tests that take seconds; `test-slow` the end-to-end runs (demos,
# Flink jobs, restarts, DDP, memory at scale); `soak`, `test-containers` and `fuzz` the rest. .ci/run runs them all.
# TEST_JOBS: pytest-xdist workers for test-slow, whose runs mostly wait on clocks and child processes.
TEST_JOBS ?= 2
test: $(STAMP) sysdeps $(FLINK_STAMP) lint ## Lint, then the tests that take seconds (not marked slow); the 15 slowest printed
	$(PY) -m pytest -m "not slow" --durations=15 $(ARGS)

test-slow: $(STAMP) sysdeps $(FLINK_STAMP) ## The end-to-end tier: tests marked slow (demos, Flink, restarts, DDP, memory at scale)
	$(PY) -m pytest -m slow -n $(TEST_JOBS) --dist loadfile --durations=15 $(ARGS)

# Line and branch coverage of every package of ours over both pytest tiers, server and worker processes included
# (pyproject.toml's [tool.coverage]; docs/testing.md has the tables). COV_DIR holds the data and the report.
COV_DIR ?= artifacts/coverage
coverage: $(STAMP) sysdeps $(FLINK_STAMP) ## Line and branch coverage over test and test-slow, per package: artifacts/coverage/table.md
	rm -rf $(COV_DIR) && mkdir -p $(COV_DIR)
	-COVERAGE_FILE=$(abspath $(COV_DIR))/.coverage $(PY) -m coverage run -m pytest -q -p no:cacheprovider $(ARGS)
	COVERAGE_FILE=$(abspath $(COV_DIR))/.coverage $(PY) -m coverage combine -q $(abspath $(COV_DIR))
	COVERAGE_FILE=$(abspath $(COV_DIR))/.coverage $(PY) -m coverage report > $(COV_DIR)/report.txt
	$(PY) scripts/coverage_table.py $(COV_DIR)/.coverage | tee $(COV_DIR)/table.md

test-containers: $(STAMP) ## The images on a real engine: podman and docker-compose from Debian, `docker compose up serving` end to end, the objectstore profile (export into a bucket, serving from it), the k8s Jobs' commands (root)
	$(PY) tests/deploy/containers/run.py

soak: $(STAMP) ## Soak under churn (~5 min, not in test or test-slow): 2 workers, load on 4 routes, a publish every 15 s, a worker SIGKILLed every 30 s, malformed bursts; fails on a lost request, a 5xx or RSS growth
	$(PY) -m tests.serving.soak_churn $(ARGS)

test-gpu: $(STAMP) ## Only the GPU tests (single-GPU training, NCCL DDP), then NCCL DDP efficiency; skip without CUDA
	$(PY) -m pytest -m gpu -rs $(ARGS)
	$(PY) -m bench.ddp_scaling --accelerator gpu --rows 1000000 --workdir artifacts/ddp_scaling

bench: $(STAMP) sysdeps ## Framework comparison; BENCH=quick for a ~10 min run
	$(PY) -m bench --mode $(or $(BENCH),full) $(ARGS)

# The speed guard (docs/perf/bench-guard.md): HEAD against the commit bench/baseline names, in paired rounds on
# this machine; HEAD_TREE measures another tree as HEAD (e.g. a worktree with a change under test).
bench-guard: $(STAMP) sysdeps ## Speed guard (~4 min): HEAD vs bench/baseline's commit; fails when >10% worse beyond the rounds' spread
	$(PY) -m bench.guard $(if $(HEAD_TREE),--head-tree $(HEAD_TREE)) $(ARGS)

bench-http: $(STAMP) sysdeps ## HTTP layer: ours vs uvicorn vs granian under load and attack (needs REPO)
	$(PY) -m bench.http_layer --model_base_path $(REPO) $(ARGS)

bench-compare: $(STAMP) ## Compare two bench runs: make bench-compare A=dir B=dir
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make bench-compare A=bench/results/<run1> B=bench/results/<run2>" >&2; exit 2; }
	$(PY) -m bench.compare $(A) $(B)

# The native code under ASan + UBSan with atheris (fuzz/run.py): Debian's clang and its sanitizer runtime
# (installed here when missing), the extensions built into build/fuzz/lib (the in-place ones untouched), the
# regression corpus (fuzz/corpus/) replayed, then FUZZ_SECONDS of coverage-guided fuzzing a target.
FUZZ_SECONDS ?= 60
FUZZ_LIB     := build/fuzz/lib
FUZZ_CFLAGS  := -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all -g -O1 -fno-omit-frame-pointer -fPIC -shared
fuzz: $(STAMP) ## Fuzz scan, keys, table, rows and scan-vs-exact under ASan + UBSan (FUZZ_SECONDS=60 a target; corpus replayed first)
	@if ! command -v clang >/dev/null || [ ! -e "$$(clang -print-file-name=libclang_rt.asan-x86_64.so)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null; \
	  else echo "fuzz: run 'sudo apt-get install clang libclang-rt-dev' first" >&2; exit 1; fi; fi
	$(PIP) install -q -r fuzz/requirements.txt
	mkdir -p $(FUZZ_LIB)/ctr_features/compiled $(FUZZ_LIB)/serving/codecs
	clang $(FUZZ_CFLAGS) -I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
	  ctr_features/compiled/_table_native.c -o $(FUZZ_LIB)/ctr_features/compiled/_table_native.so
	clang $(FUZZ_CFLAGS) -I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" -Ictr_features/compiled \
	  serving/codecs/_scan_native.c -o $(FUZZ_LIB)/serving/codecs/_scan_native.so
	$(PY) fuzz/run.py --lib $(FUZZ_LIB) --seconds $(FUZZ_SECONDS)

clean: ## Remove generated data, runs and models (keeps .venv)
	rm -rf artifacts bench/results .pytest_cache .mypy_cache .ruff_cache
