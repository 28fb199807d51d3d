# sessionrepo: every target sets itself up (venv + install) on a fresh machine.
#   make demo   three gateway processes flush overlapping transcripts; verified summary
#   make test   the contract suite on SQLite and PostgreSQL
#               (PostgreSQL from SESSIONREPO_TEST_POSTGRES_URL, see README)
#   make lint   ruff, mypy --strict and the import contracts (layering) on the package and
#               bench/; tools/import_rules.py: the public-API rule (entry points and bench/
#               use no other package's privates), third parties' privates only in
#               *_compat.py shims, and migrations that import no library code

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test lint check clean test-citus

# The package is installed editable in setuptools' strict mode: a tree of links named as the
# package is (sessionrepo/, sessionrepo/models/, ...) that mypy and import-linter can read.
# A new or removed file needs a new link tree, so the install runs again when the list of
# package files changes.
PACKAGE_FILES := $(shell find repo models migrations -name '*.py' -o -name '*.mako' -o -name py.typed | LC_ALL=C sort)
ifneq ($(strip $(PACKAGE_FILES)),$(strip $(shell cat $(VENV)/.package-files 2>/dev/null)))
.PHONY: $(STAMP)
endif

# Every user-facing extra, plus the dev dependency group (PEP 735: test, bench and the lint
# tools), which needs pip 25.1 or newer.
EXTRAS := web,metrics,tracing,openai-agents,langchain,adk,semantic,sqlite-vec

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade 'pip>=25.1'
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' --group dev \
		--config-settings editable_mode=strict
	echo '$(PACKAGE_FILES)' > $(VENV)/.package-files
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sessionrepo demo

# The suite on TEST_WORKERS processes (pytest-xdist; each test makes its own database and
# files, so they share nothing): half the time on this project's 2-core machines.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

LINTED := models repo migrations tests bench tools

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy -p sessionrepo -p bench -m tools.import_rules
	$(BIN)/lint-imports
	$(BIN)/python tools/import_rules.py

check: lint test

# make screenshots   the README's pictures of the console (docs/console-*.png), taken in
#                    Chromium from the demo's data by the browser tests
.PHONY: screenshots
screenshots: $(STAMP)
	SESSIONREPO_SCREENSHOTS=$(CURDIR)/docs $(BIN)/python -m pytest -q tests/web/test_web_screenshots.py

# make bench   sessionrepo against the raw drivers and the peer stores (issues 7, 13), about
#              15 minutes; results in bench/results/. BENCH_ARGS=--quick for a smoke run.
#              Then bench/longrun.py (issue 31, about 25 minutes): RSS over 100,000 writes of
#              50 KB, and 8 writers' RSS per minute over 10 minutes, on both backends; and
#              bench/semantic_eval.py: recall@10 and MRR of each search mode on the
#              committed corpus (bench/semantic/), for every embedder installed (the
#              smoke run: the default one, its results in a temporary folder).
#              PostgreSQL from BENCH_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
#              With BENCH_CITUS_URL (a Citus coordinator), then bench/citus.py: sessionrepo on
#              Citus against that PostgreSQL (BENCH_CITUS_ARGS=--quick for a smoke run).
#              Before/after a change, in one interleaved run (each sessionrepo contender
#              also on another checkout's package, paired round by round):
#                git worktree add /tmp/before main
#                make bench BENCH_ARGS="--baseline /tmp/before"
.PHONY: bench
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.longrun $(filter --quick,$(BENCH_ARGS))
	$(BIN)/python -m bench.semantic_eval $(if $(filter --quick,$(BENCH_ARGS)),--embedder use --out $$(mktemp -d)/semantic-eval)
	$(if $(BENCH_CITUS_URL),$(BIN)/python -m bench.citus --citus-url '$(BENCH_CITUS_URL)' $(BENCH_CITUS_ARGS))

# make test-citus  the Citus tests (tests/dialects/test_citus.py, tests/citus/: one worker of
#                  three stopped, on a cluster of its own), the contract suite, the erasure's
#                  (tests/ops: erase, its race, retention) and the framework
#                  adapters (tests/integrations: ADK, LangChain, OpenAI Agents) on a throwaway
#                  Citus cluster (a coordinator and 2 workers, started and stopped by
#                  tests/citus_cluster.py from the installed citus extension; or the
#                  coordinator SESSIONREPO_TEST_CITUS_URL names), about 15 minutes on 2
#                  cores. CITUS_TESTS picks a subset (.ci/run runs CITUS_CI_TESTS).
CITUS_CONTRACT := $(addprefix tests/contract/test_,append.py boundary.py concurrency.py \
	editing.py faithful_storage.py operator_methods.py search.py sessions.py)
CITUS_ERASURE := $(addprefix tests/ops/test_,erase.py erase_race.py erased_copies.py retention.py)
CITUS_TESTS ?= tests/dialects/test_citus.py tests/citus $(CITUS_CONTRACT) $(CITUS_ERASURE) \
	tests/tenancy/test_isolation.py tests/integrations -k citus
CITUS_CI_TESTS := tests/dialects/test_citus.py tests/citus tests/tenancy/test_isolation.py \
	tests/contract/test_append.py \
	tests/contract/test_search.py tests/contract/test_operator_methods.py \
	tests/ops/test_erase_race.py tests/integrations/test_adk.py -k "citus and not async"
test-citus: $(STAMP)
	$(BIN)/python tests/citus_cluster.py run -- $(BIN)/python -m pytest $(CITUS_TESTS)

# make test-sqlite-vec  the semantic search tests on SQLite with sqlite-vec loaded (issue 29),
#                       on a Python whose sqlite3 loads extensions: SQLITE_VEC_PYTHON, by
#                       default Debian's /usr/bin/python3 (pyenv's builds, as this project's
#                       own Python may be, have no enable_load_extension: there these tests
#                       skip, saying so), in a venv of its own with the package installed
#                       from this tree. About a minute.
SQLITE_VEC_PYTHON ?= /usr/bin/python3
VEC_VENV := .venv-sqlite-vec
SQLITE_VEC_TESTS ?= tests/search/test_semantic_sqlite_vec.py tests/search/test_semantic.py \
	tests/search/test_semantic_cache.py -k "sqlite or not postgres"
.PHONY: test-sqlite-vec
test-sqlite-vec:
	$(SQLITE_VEC_PYTHON) -c 'import sqlite3, sys; hasattr(sqlite3.Connection, "enable_load_extension") or sys.exit("$(SQLITE_VEC_PYTHON): its sqlite3 cannot load extensions")'
	test -x $(VEC_VENV)/bin/python || $(SQLITE_VEC_PYTHON) -m venv $(VEC_VENV)
	$(VEC_VENV)/bin/python -m pip install --quiet --upgrade 'pip>=25.1'
	$(VEC_VENV)/bin/python -m pip install --quiet '.[semantic,sqlite-vec]' --group test
	$(VEC_VENV)/bin/python -m pip install --quiet --no-deps --force-reinstall .
	$(VEC_VENV)/bin/python -m pytest -n $(TEST_WORKERS) $(SQLITE_VEC_TESTS)

# make test-frameworks   the frameworks' own session tests (OpenAI Agents SDK, LangChain, Google
#                        ADK; the installed releases' test files, from their sdists on PyPI)
#                        against sessionrepo's adapters, on SQLite and PostgreSQL
#                        (SESSIONREPO_TEST_POSTGRES_URL); ADK's from ADK_TESTS=<checkout>.
#                        FRAMEWORK_ARGS: e.g. --backend sqlite --framework langchain
.PHONY: test-frameworks
test-frameworks: $(STAMP)
	$(BIN)/python tests/frameworks/run.py $(FRAMEWORK_ARGS)

clean:
	rm -rf $(VENV) $(VEC_VENV) build .mypy_cache .ruff_cache .pytest_cache .hypothesis
