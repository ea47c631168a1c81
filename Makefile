# The two README commands:  make example  (the bundled SciFact chain, raw files to the distilled retriever)
# and  make test  (the workflow's lint, then all tests: what CI runs). Day to day:  make test-fast  (the unit
# tier: no whole-chain Snakemake run, no Java, no Slurm); after changing the schema:  make docs.
# Both create the .venv on first use: pip with torch held at the CPU wheel by constraints.txt.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

# On a GPU cluster whose NVIDIA driver is older than PyPI's torch needs (docs/cluster.md, Software), e.g.
#   make install TORCH_CUDA=cu126
# installs constraints.txt's torch version as the PyTorch index's build for that CUDA release (torch==<version>+cu126)
TORCH_CUDA ?=
TORCH_WHEEL = $(if $(TORCH_CUDA),"torch==$(shell sed -n 's/^torch==//p' constraints.txt)+$(TORCH_CUDA)" \
	--extra-index-url https://download.pytorch.org/whl/$(TORCH_CUDA))

.PHONY: install example test test-avx2 test-fast lint docs gpu-check site cluster-check clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install -c constraints.txt -e '.[test]' $(TORCH_WHEEL)
	touch $(STAMP)

install: $(STAMP)
ifneq ($(TORCH_CUDA),)
	$(VENV)/bin/python -m pip install -c constraints.txt $(TORCH_WHEEL)
endif

example: $(STAMP)
	$(VENV)/bin/snakemake
	@cat results/scifact/summary.md

# Two pytest runs side by side, each printing its 25 slowest tests: the workflow through a real Slurm (mostly waiting
# on its scheduler) with the other collections' chains (NQ, the MS MARCO stand-in) and the fault tests' chains, whose
# report (logs/test_side.log) follows that of everything else; either failing fails. The split keeps the two about
# equally long (docs/architecture.md).
SIDE_TESTS := tests/test_slurm.py tests/test_rehearsal.py tests/test_nq.py tests/test_msmarco.py tests/test_faults.py
test: $(STAMP)
	$(VENV)/bin/snakemake --lint
	@mkdir -p logs
	$(VENV)/bin/python -m pytest -q --durations=25 $(SIDE_TESTS) > logs/test_side.log 2>&1 & side=$$!; \
	$(VENV)/bin/python -m pytest -q --durations=25 $(addprefix --ignore=,$(SIDE_TESTS)); rest=$$?; \
	wait $$side; other=$$?; echo "--- $(SIDE_TESTS), run beside the above: exit $$other"; \
	cat logs/test_side.log; test $$rest -eq 0 -a $$other -eq 0

# The suite as on a CPU without AVX512 (AMD Zen 3): float32 instead of bf16 autocast, PyTorch's AVX2 kernels
test-avx2: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 DPR_PIPELINE_CPU_BF16=0 $(MAKE) test

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/snakemake --lint

# docs/configuration.md from schemas/config.schema.yaml, docs/bad_inputs.md from tests/test_bad_inputs.py's cases
# (tests/test_config_reference.py and test_bad_inputs.py fail while either is stale)
docs: $(STAMP)
	$(VENV)/bin/python scripts/config_reference.py
	$(VENV)/bin/python tests/bad_inputs_catalogue.py

# On a cluster's login node, once: site.yaml (or $DPR_PIPELINE_SITE's file), the config's `cluster` block proposed
# from what sinfo, scontrol and sacctmgr say, for you to review; an existing one is kept (the proposal goes beside it)
site: $(STAMP)
	$(VENV)/bin/python scripts/site_probe.py

# Before a cluster run, on the login node: every job of TARGET's plan against the site file's `cluster` block and
# what sinfo/sacctmgr say (scripts/cluster_check.py); CONFIG: config file(s) the run is also given with
# --configfile, if any; CHECK_ARGS: e.g. --profile <your profile> or --group-components as given to snakemake
TARGET ?= results/msmarco/distill/metrics.json
CONFIG ?=
CHECK_ARGS ?=
cluster-check: $(STAMP)
	$(VENV)/bin/python scripts/cluster_check.py $(TARGET) $(foreach file,$(CONFIG),--configfile $(file)) $(CHECK_ARGS)

# On a new GPU node, before a long run: the `gpu` tests and the encode, pre-training and fine-tuning benchmarks,
# with the device name, throughput and MFU, in gpu_check/report.md (scripts/gpu_check.py)
gpu-check: $(STAMP)
	$(VENV)/bin/python scripts/gpu_check.py --output gpu_check/report.md

clean:
	rm -rf results .snakemake
