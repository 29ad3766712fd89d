# `make run` and `make test` work on a fresh machine: each creates .venv when it
# is missing and (re)installs the project whenever setup.py changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: run test lint bench compat chaos chaos-seeds chaos-cluster spark-stream clean

$(PY):
	@echo "make: creating the virtual environment $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)

# pip runs quietly (pyspark alone is a large download): one line says what is happening.
$(INSTALLED): $(PY) setup.py
	@echo "make: installing Warren with its test, spark, plot, bench and cluster extras into $(VENV)" \
		"(a few minutes on a fresh machine; quiet until done)"
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,spark,plot,bench,cluster]'
	@touch $(INSTALLED)
	@echo "make: installed; $(VENV)/bin/warren is the command line"

run: $(INSTALLED)
	$(PY) examples/demo.py

# pytest exits 5 when it collects no test; make fails on any non-zero exit.
# Two workers a core, each taking whole test modules (a module's Spark session is
# started once): the suite's tests mostly wait on processes, sockets, leases and disks
# (three workers kept two cores 70 % busy, and took 15:03 where four took 12:13). The
# modules go in collection order, where tests/conftest.py puts the longest first.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# mypy checks the installed ``warren`` package, which exists only under setup.py's mapping
# of the part folders; build/typecheck lays that mapping out as links for it to read.
TYPECHECK := build/typecheck
lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/warren
	for f in supervisor/facade/*.py; do ln -s "$$PWD/$$f" $(TYPECHECK)/warren/; done
	for part in actors store queues supervisor; do ln -s "$$PWD/$$part" $(TYPECHECK)/warren/; done
	cd $(TYPECHECK) && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml -p warren

bench: $(INSTALLED)
	$(PY) -m bench $(BENCH)

# Other AMQP clients' own test suites against the AMQP port (docs/amqp.md, "Compatibility,
# measured with the clients' own suites"): 20 minutes or more, so not part of `test`.
# SUITES names the folder of the exported suites; COMPAT_ARGS picks some
# (--suites pika,kombu); RabbitMQ's run is added where rabbitmq-server is installed.
COMPAT_ARGS ?=
compat: $(INSTALLED)
	@test -n "$(SUITES)" || { echo "make compat: give SUITES=DIR, the folder of the exported client suites (pika kombu py-amqp aiormq aio-pika celery)" >&2; exit 2; }
	$(PY) -m bench.compat --suites-dir "$(SUITES)" --against rabbitmq $(COMPAT_ARGS)

# Five minutes of every fault on a fresh node; the report lands in build/chaos/report.
CHAOS_ARGS ?= --duration 300 --faults kill,stop,node,torn,flip,full,slow
chaos: $(INSTALLED)
	rm -rf build/chaos && mkdir -p build/chaos
	$(PY) -m warren.supervisor.cli chaos --data-dir build/chaos/data --report build/chaos/report $(CHAOS_ARGS)

# The seeds a chaos run once failed on, each run again for 30 s (each bug has a test of
# its own in make test): after a change to the harness or to recovery. SEED:SIZES:GC.
CHAOS_SEEDS ?= 376620024:1KiB..64KiB:compact 2144887954:1KiB..16KiB:combine
chaos-seeds: $(INSTALLED)
	rm -rf build/chaos-seeds
	set -e; for entry in $(CHAOS_SEEDS); do \
		set -- $$(echo "$$entry" | tr : ' '); mkdir -p build/chaos-seeds/$$1; \
		$(PY) -m warren.supervisor.cli chaos --data-dir build/chaos-seeds/$$1/data \
			--report build/chaos-seeds/$$1/report --duration 30 --seed $$1 --producers 2 \
			--size $$2 --store-gc $$3; \
	done

# Eight minutes of the cluster's faults, round after round, on three etcd members and three
# nodes made fresh under build/chaos-cluster (needs etcd: Debian's etcd-server).
CHAOS_CLUSTER_ARGS ?= --duration 480
chaos-cluster: $(INSTALLED)
	rm -rf build/chaos-cluster && mkdir -p build
	$(PY) -m warren.supervisor.cli chaos --cluster --data-dir build/chaos-cluster/nodes --report build/chaos-cluster/report $(CHAOS_CLUSTER_ARGS)

# Spark -> stream -> Spark with a driver killed midway, at full size (a million events).
spark-stream: $(INSTALLED)
	$(PY) examples/spark_stream_pipeline.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
