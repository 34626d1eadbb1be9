# clustertool: `make demo` runs the main job on a local cluster, `make test` runs the tests.
# Both install what they need first (apt packages as root, then a virtualenv in .venv).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
APT_PACKAGES := python3 python3-venv python3-pip python3-dev build-essential make \
	openssh-server openssh-client iproute2 procps psmisc util-linux \
	openmpi-bin libopenmpi-dev pdsh rsync tmux iperf3 shellcheck nftables sshfs \
	prometheus prometheus-node-exporter chromium slurmd slurmctld slurm-client munge
# Debian starts (and enables) some of these as system services when it installs them: Prometheus and
# its node exporter, and munged with the machine's own /etc/munge key. clustertool starts its own, on
# the cluster's nodes only (`monitoring enable`; each cluster's munged with the cluster's key and socket,
# clustertool/slurm/), so a service this target brought is stopped and disabled at once (quiet-daemons).
# slurmd and slurmctld do not start without /etc/slurm/slurm.conf (their units' condition).
NO_DAEMONS := prometheus prometheus-node-exporter munge slurmd slurmctld

.PHONY: setup apt quiet-daemons venv native demo lint test test-fast test-faults test-slow bench clean

setup: apt venv

# Installs only what is missing, so a prepared machine does not wait for apt.
apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing packages: $$missing (run as root, or apt-get install them)"; exit 1; fi; \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  $(MAKE) --no-print-directory quiet-daemons NEW="$$missing"; \
	fi

# The system services of NO_DAEMONS that this install brought (NEW): stopped and disabled.
quiet-daemons:
	@for unit in $(NO_DAEMONS); do \
	  case " $(NEW) " in *" $$unit "*) ;; *) continue ;; esac; \
	  if [ "$$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then systemctl disable --now $$unit >/dev/null 2>&1; \
	  elif [ -x /etc/init.d/$$unit ]; then /etc/init.d/$$unit stop >/dev/null 2>&1; \
	    update-rc.d $$unit disable >/dev/null 2>&1; fi; \
	  echo "stopped and disabled the system's $$unit service (clustertool starts its own on cluster nodes)"; \
	done; true

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,train]'
	@# With CUDA's nvcc present, NCCL's headers too, so the plugin's GPU program compiles (make -C native gpu)
	@if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then \
	  echo "nvcc found: installing NCCL headers (nvidia-nccl-cu13)"; $(PY) -m pip install -q nvidia-nccl-cu13; fi
	touch $@

# PyTorch, for the synthetic workload's CPU path (tested in `make test`) and the GPU proof
# (bench/nccl_gpu.py). An explicit, separate step rather than a package extra: pip needs a pin
# to take the same release everywhere, and the choice of wheel is the user's. Sizes differ a
# lot: here pip finds a local CPU wheel (~180 MB); from PyPI on Linux x86_64 torch is the CUDA
# build with its nvidia-* wheels (several GB). CPU-only elsewhere:
#   make venv TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# NO_TORCH=1 skips it (the tests that need torch then skip and say why).
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
$(VENV)/.torch: $(VENV)/.installed
	@if [ -n "$(NO_TORCH)" ]; then echo "NO_TORCH set: not installing PyTorch"; else \
	  echo "installing $(TORCH_SPEC) $(TORCH_PIP_ARGS) (a CPU wheel is ~180 MB; PyPI's CUDA build is several GB)"; \
	  $(PY) -m pip install -q $(TORCH_PIP_ARGS) '$(TORCH_SPEC)' && touch $@; fi

# The launchers `run --launcher accelerate|deepspeed` start, for their tests (after torch: both need
# it, and from PyPI pip would otherwise fetch its CUDA build). DeepSpeed is an sdist whose setup
# imports torch: no build isolation, and DS_BUILD_OPS=0 compiles none of its ops (a few seconds).
LAUNCHER_SPECS ?= accelerate deepspeed
$(VENV)/.launchers: $(VENV)/.torch
	@if [ -n "$(NO_TORCH)" ]; then echo "NO_TORCH set: not installing accelerate, deepspeed"; else \
	  echo "installing $(LAUNCHER_SPECS)"; \
	  $(PY) -m pip install -q setuptools wheel packaging && \
	  DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation $(LAUNCHER_SPECS) && touch $@; fi

venv: $(VENV)/.installed $(VENV)/.torch $(VENV)/.launchers

native:
	$(MAKE) -C native

demo: setup
	$(VENV)/bin/clustertool play playbooks/quickstart-local.yaml

# House rules (pyproject's [tool.ruff]: line length 120, pyflakes, pycodestyle, import order)
# and types (pyproject's [tool.mypy]: the package, stricter per module as modules get clean)
lint: venv
	$(VENV)/bin/ruff check clustertool tests bench examples native/bench
	$(VENV)/bin/mypy

# The tests run in TEST_WORKERS processes (pytest-xdist; TEST_WORKERS=0: one process). Most of the
# suite waits on sshd, namespaces and subprocesses rather than on the CPU, so more workers than cores
# pay. Tests that share a module's cluster, or native/'s build folder, share a worker
# (tests/xdist_groups.py says which). native/'s C tests (`make -C native test`, and under ASan) and its
# GPU program (`make -C native gpu`, compiled where nvcc is) run inside pytest (tests/native/), once
# each; here the plugin is only built, before the workers start using it.
TEST_WORKERS ?= 4
test: setup
	$(MAKE) -C native all
	$(VENV)/bin/ruff check clustertool tests bench examples native/bench
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The whole AWS fault matrix (every signal after every AWS call of up, down, replace and the
# shared-fs and reservation calls, the default 60 s budget against a hanging endpoint, racing ups)
# and the slow recovery cases (spot notice, lost leader): slow, so `make test` runs a subset.
# FAULT_TABLE=path also writes the table of case -> leaked resources there.
test-faults: venv
	CLUSTERTOOL_FAULT_TABLE=$(FAULT_TABLE) $(VENV)/bin/pytest -q -m aws tests/aws/test_fault_matrix.py
	$(VENV)/bin/pytest -q -m slow tests/local/test_recovery.py

# Everything `make test` leaves out (-m slow): the fault matrix and slow recovery cases above, the C tests
# under AddressSanitizer and UBSan (`make -C native asan`), and Slurm's jobs under the other node launchers.
test-slow: test-faults
	$(VENV)/bin/pytest -q -m slow tests/native tests/local/test_slurm_cluster.py

test-fast: venv
	$(VENV)/bin/ruff check clustertool tests bench examples native/bench
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -q -m "unit or cli"

clean:
	rm -rf $(VENV) native/build .pytest_cache .mypy_cache
