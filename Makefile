# The two commands: `make up` and `make test`. Everything they need is installed here,
# from the lock: `make lock` refreshes it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
LOCK   := lock/python.txt
PIP    := lock/pip.txt

.PHONY: up test lint bench clean system-deps lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip first, at the lock's version: an older pip (23.2, the one a Python 3.11 venv gets)
# refuses a hashed lock whose packages ask for a dependency's extras (python-socks[asyncio]).
# Then every dependency at the lock's version, each file checked against the lock's hashes;
# then ppf itself from this tree, nothing resolved again (no dependencies, and built by
# the lock's setuptools). `pip check` catches a pyproject.toml changed without `make lock`.
# The C extensions' built files are removed first: an editable reinstall keeps a built
# module it finds in the tree, however old.
$(STAMP): $(PIP) $(LOCK) pyproject.toml setup.py agents/_scan.c eventlog/_frames.c | $(BIN)/python
	rm -f agents/_scan.*.so eventlog/_frames.*.so
	$(BIN)/python -m pip install -q --require-hashes -r $(PIP)
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	$(BIN)/pip check || { echo "the lock misses what pyproject.toml asks for: run make lock"; exit 1; }
	touch $@

up: $(STAMP)
	$(BIN)/ppf up

# Debian packages the integration tests use, at lock/debian.txt's versions.
system-deps:
	@bash lock/debian-packages.sh

# The lock, refreshed: pip and every Python dependency at its newest version pyproject.toml
# allows, with the hashes of its files (pip-tools, in a throwaway virtualenv), and the
# Debian packages' versions as installed here.
lock:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp" && "$$tmp/bin/pip" install -q 'pip-tools>=7.7' && \
	"$$tmp/bin/pip-compile" -q --upgrade --generate-hashes --extra dev --strip-extras \
	  --build-deps-for editable --unsafe-package ppf --no-emit-index-url \
	  --no-emit-find-links -o $(LOCK) pyproject.toml && \
	echo pip | "$$tmp/bin/pip-compile" -q --upgrade --generate-hashes --allow-unsafe \
	  --strip-extras --no-emit-index-url --no-emit-find-links -o $(PIP) -
	dpkg-query -W -f='$${Package}=$${Version}\n' $$(cut -d= -f1 lock/debian.txt) > lock/debian.txt.new
	mv lock/debian.txt.new lock/debian.txt

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/ppf schemas --check

# pytest exits 5 when it collected no test: make treats that as a failure, as it should.
# The suite waits far more than it computes: the world-in-a-box tests (two boxes at once
# take each other's route) run one at a time in one process, beside the rest in three
# (two cores: most of the rest waits on timers and sockets); the floods, and the tests
# whose bar is a time or a rate (marker `serial`), run after the rest, one at a time;
# the box's output follows the rest's, and any part failing fails the target.
test: lint system-deps
	@log=$$(mktemp); \
	$(BIN)/pytest -m box -p no:cacheprovider --durations=8 >"$$log" 2>&1 & box=$$!; \
	$(BIN)/pytest -n 3 -m "not box and not flood and not serial" --durations=15; rest=$$?; \
	$(BIN)/pytest -m "(flood or serial) and not box" -p no:cacheprovider; flood=$$?; \
	wait $$box; boxed=$$?; \
	echo "--- the world-in-a-box tests, run beside the rest (exit $$boxed) ---"; \
	cat "$$log"; rm -f "$$log"; \
	test $$rest = 0 && test $$flood = 0 && test $$boxed = 0

bench: $(STAMP)
	$(BIN)/ppf bench fold

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
