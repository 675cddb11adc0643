# Two commands do everything on a fresh machine:
#   make demo   set up .venv, then run the whole local campaign (examples/local.yaml) afresh, with a
#               fault drilled into its long run (NO_DRILL=1: without), and show its status
#   make test   set up .venv and the system packages the tests use, then run the test suite
#   make wheel-check   the built wheel, installed without extras, runs the local campaign
#   make bench-smoke   every benchmark at its smallest setting: each prints its target, exit 1 on a miss
# TORCH is what gets installed when the venv has no torch yet; on a machine whose torch
# is already suitable (e.g. a venv made with --system-site-packages on Aurora) nothing is replaced.

VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# Two pytest-xdist workers: on one process the suite leaves about half of 2 cores idle (waits
# on watchdogs, schedulers and start-up). Tests of one shared stand-in (Slurm cluster, PBS
# emulator) stay on one worker: SHARED_STAND_INS in tests/conftest.py. 0: one process.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: demo test test-fast wheel-check bench-smoke setup system-deps clean

# The demo starts over each time (`campaign forget`). Mid long run it drills a fault, as
# `campaign inject` lets anyone do: rank 1 hangs (SIGSTOP) after step 60 of the long run; the
# watchdog names local-n1, a surviving rank saves the last step (rescue), local-n1 is excluded
# for this campaign only, and the long run relaunches on the spare local-n2 and resumes
# exactly. `make demo NO_DRILL=1` runs the campaign without it. The campaign's chart:
# `campaign plot local-demo` (plots/local-demo-run.png).
NO_DRILL ?=
CAMPAIGN := $(VENV)/bin/campaign

demo: $(VENV)/.installed
	$(CAMPAIGN) forget local-demo --yes --missing-ok
	@if [ -z "$(NO_DRILL)" ]; then \
	  $(CAMPAIGN) inject local-demo hang --rank 1 --stage long-run --after-step 60 --attempt next --wait 300 & \
	  drill=$$!; \
	  $(CAMPAIGN) submit examples/local.yaml; code=$$?; \
	  kill $$drill 2>/dev/null; wait $$drill 2>/dev/null; \
	  [ $$code -eq 0 ] || exit $$code; \
	else \
	  $(CAMPAIGN) submit examples/local.yaml; \
	fi
	$(CAMPAIGN) status local-demo

test: $(VENV)/.installed system-deps
	$(PYTEST) $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# Build the wheel, install it without extras into a fresh venv (TORCH first), run
# examples/local.yaml from a temp dir outside the tree and plot it (.ci/wheel-check; ~3 min).
wheel-check: $(VENV)/.installed
	PY=$(PY) TORCH="$(TORCH)" bash .ci/wheel-check

# Every benchmark in benchmarks/ at its smallest setting (benchmarks/_smoke.py lists them and
# their arguments; GPU-only ones skip with the reason on a machine without one). ~4 min on 2 cores.
bench-smoke: $(VENV)/.installed system-deps
	$(PY) benchmarks/_smoke.py $(BENCH)

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,postgres,plot,tensorboard,wandb]"
	touch $@

# MPICH's mpiexec (the launcher tests run it for real). The Slurm cluster script installs
# slurm-wlm and munge itself when its tests start it.
system-deps:
	@command -v mpiexec.hydra >/dev/null 2>&1 || command -v mpiexec.mpich >/dev/null 2>&1 || \
	  { echo "installing Debian's mpich"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mpich >/dev/null; }

clean:
	rm -rf $(VENV) campaigns build *.egg-info
