# The two commands: `make up` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev

.PHONY: up test lint bench clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The C extensions' built files are removed first: an editable reinstall keeps a built
# module it finds in the tree, however old.
$(STAMP): pyproject.toml setup.py agents/_scan.c ops/nats/_frames.c | $(BIN)/python
	rm -f agents/_scan.*.so ops/nats/_frames.*.so
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

up: $(STAMP)
	$(BIN)/ppf up

# Debian packages the integration tests use: installed when missing and we are root;
# otherwise those tests skip, naming what to install.
SYSTEM_PACKAGES := chromium squid tinyproxy microsocks dante-server openssl iproute2
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "not root: install$$missing (apt-get install$$missing); their tests will skip"; fi; \
	fi

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
