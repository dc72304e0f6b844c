# Every target installs what it needs first; `make` alone prints this help.
PYTHON ?= python3
CONFIG ?= configs/default.yaml
ARGS ?=
RUN ?=
INPUT ?=
OUTPUT ?=
PORT ?= 6006
PORT_NB ?= 8888
NAME ?=
LOGS ?= logs
SWEEP ?= configs/sweeps/default.yaml
WORKERS ?= 1
# Test processes (pytest-xdist): one per CPU core this process may use, however many (each test's torch gets its
# share of them: tests/conftest.py); TEST_WORKERS=0 runs the tests in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1)")
# Extra pip requirement installed before the project and kept while it installs (so its extras, e.g. timm's torchvision,
# resolve against it), e.g. TORCH_SPEC=torch==2.13.0 for the small CPU build
# (make install TORCH_SPEC=... also switches an existing .venv to it).
TORCH_SPEC ?=
# More extras for make install, e.g. EXTRAS=hf or EXTRAS=mlflow,wandb,hf (their tests skip without them).
EXTRAS ?=
MLFLOW_PORT ?= 5000
# LOCKED=1: install the versions in constraints.txt (the ones the suite was last green with; `make lock`).
LOCKED ?=
# make new-project: the new repository's folder (new or empty), beside this checkout by default.
DEST ?= ../$(NAME)
# make new-project: the shipped examples to copy (scripts/shipped_examples.json), e.g. KEEP="table regression"; all, none.
KEEP ?= all
# make update-engine: the template's version to merge, a tag or commit of the template .copier-answers.yml names
# (default: its newest tag, else its HEAD).
TEMPLATE ?=

VENV := .venv
# The package (its folder and import name; make new-project renames it in a repository of your own).
PACKAGE := project
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed$(if $(LOCKED),-locked)
CONSTRAINTS := $(if $(LOCKED),-c constraints.txt)
# timm brings torchvision, which pip takes from PyPI: a build for PyPI's torch. Beside another torch build (the small
# CPU one of TORCH_SPEC=torch==2.13.0) its operators cannot load and its import fails ("operator torchvision::nms
# does not exist"), and torchmetrics, so Lightning, imports torchvision whenever it is installed: every command would
# fail. The install then removes the pair, saying so: only project.backbones.TimmNet needs them (its test skips).
DROP_UNLOADABLE_TORCHVISION = @$(BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('torchvision') is None)" \
	&& ! $(BIN)/python -c "import torchvision" 2>/dev/null \
	&& echo "note: torchvision from PyPI cannot load beside torch $$($(BIN)/python -c 'import torch; print(torch.__version__)'): uninstalling it and timm (TimmNet needs them; install a matching pair, e.g. torch==2.14.1 torchvision==0.29.1)" \
	&& $(BIN)/pip uninstall -y -q torchvision timm || true

.DEFAULT_GOAL := help
.PHONY: help new-project update-engine install hooks lock example-data train train-ddp resume runs sweep sweep-status predict export profile lr-find bench notebooks test test-all test-fast test-minimum contract check-manual tensorboard mlflow lint format clean clean-logs

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: CONFIG=$(CONFIG) ARGS='$(ARGS)' RUN='$(RUN)' INPUT='$(INPUT)' OUTPUT='$(OUTPUT)'"
	@echo "             NAME='$(NAME)' LOGS=$(LOGS) SWEEP=$(SWEEP) WORKERS=$(WORKERS) TEST_WORKERS=$(TEST_WORKERS)"
	@echo "             PORT=$(PORT) PORT_NB=$(PORT_NB) MLFLOW_PORT=$(MLFLOW_PORT) PYTHON=$(PYTHON) TORCH_SPEC='$(TORCH_SPEC)'"
	@echo "             LOCKED='$(LOCKED)' EXTRAS='$(EXTRAS)' DEST=$(if $(NAME),$(DEST),'../<NAME>') KEEP='$(KEEP)' TEMPLATE=$(TEMPLATE)"

# Reinstalled whenever pyproject.toml (or, with LOCKED=1, constraints.txt) is newer than the last install, with the
# TORCH_SPEC and EXTRAS given (in one resolution); it records them, so make install with the same ones does nothing.
$(INSTALLED): pyproject.toml $(if $(LOCKED),constraints.txt)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_SPEC),$(BIN)/pip install $(CONSTRAINTS) '$(TORCH_SPEC)')
	$(BIN)/pip install $(CONSTRAINTS) $(if $(TORCH_SPEC),'$(TORCH_SPEC)') -e '.[dev$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	$(DROP_UNLOADABLE_TORCHVISION)
	echo '$(TORCH_SPEC) $(EXTRAS)' > $@

# copier (copier.yml) makes and updates a repository of your own: installed into .venv alone if make install has not.
COPIER = @test -x $(BIN)/copier || { test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); $(BIN)/pip install -q $(CONSTRAINTS) 'copier>=9'; }
# The first commit is yours when git knows who you are (user.email); otherwise it is signed new-project@localhost.
GIT_AS_TEMPLATE = git $(if $(shell git config user.email),,-c user.name=new-project -c user.email=new-project@localhost) \
	-c init.defaultBranch=main
space := $(subst ,, )
# copier takes the template's version from its tags, which must be PEP 440 versions: a tag that is none (v2-bar) is
# named in one sentence, instead of copier's "version from template not detected".
NOT_A_VERSION_TAG = $(BIN)/python -c "import re, subprocess, sys, yaml; from packaging.version import VERSION_PATTERN; \
	src = yaml.safe_load(open('.copier-answers.yml'))['_src_path']; \
	refs = subprocess.run(['git', 'ls-remote', '--tags', src], capture_output=True, text=True).stdout.split(); \
	tags = sorted({r.removeprefix('refs/tags/').removesuffix('^{}') for r in refs if r.startswith('refs/tags/')}); \
	bad = [t for t in tags if not re.fullmatch(VERSION_PATTERN, t, re.VERBOSE | re.IGNORECASE)]; \
	print(f'error: the template ({src}) has tags that are no PEP 440 version ({\", \".join(map(repr, bad))}): copier reads the version to merge from the tags, so it cannot update. Tag the template with versions (git tag v1.3, or 2.0.1) and delete the others (git tag -d <tag>), then make update-engine (TEMPLATE=<a version tag> merges that one).', file=sys.stderr)"

new-project: ## your own repository: this one with the package renamed to NAME, only the examples KEEP names, in DEST
	@test -n "$(NAME)" || { echo "error: NAME= the new package's name, e.g. make new-project NAME=churn" >&2; exit 2; }
	@test -f copier.yml || { echo "error: this checkout is no template (no copier.yml): run make new-project in the template's." >&2; exit 2; }
	@! { test -e "$(DEST)" && { test ! -d "$(DEST)" || test -n "$$(ls -A "$(DEST)")"; }; } \
		|| { echo "error: DEST='$(DEST)' exists and is not an empty folder: name a new one." >&2; exit 2; }
	@$(PYTHON) scripts/new_project.py check $(NAME) "" $(filter-out all none,$(KEEP))
	@test -z "$$(git status --porcelain)" || echo "warning: this checkout's uncommitted changes go into $(DEST) too, but make update-engine there needs a commit of the template: commit them first." >&2
	$(COPIER)
	$(BIN)/copier copy --trust --quiet --defaults --vcs-ref HEAD --data package=$(NAME) \
		$(if $(filter-out all,$(KEEP)),--data 'keep=[$(subst $(space),$(comma)$(space),$(strip $(filter-out none,$(KEEP))))]') \
		$(CURDIR) $(DEST)
	cd $(DEST) && $(GIT_AS_TEMPLATE) init -q && $(GIT_AS_TEMPLATE) add -A \
		&& $(GIT_AS_TEMPLATE) commit -q -m "$(NAME): a new project from the Lightning template at $$(git -C $(CURDIR) rev-parse --short HEAD)"
	@echo "New repository $(DEST) (package $(NAME)), one commit. Next: cd $(DEST) && make install && make test"

update-engine: ## in a repository made by new-project: merge the template's newer version three ways (copier update; TEMPLATE= a version)
	$(COPIER)
	@said=$$(mktemp); status=0; \
	$(BIN)/copier update --trust --quiet --defaults --conflict inline $(if $(TEMPLATE),--vcs-ref $(TEMPLATE)) 2>"$$said" || status=$$?; \
	if grep -q "version from template not detected" "$$said"; then rm -f "$$said"; $(NOT_A_VERSION_TAG); exit 2; fi; \
	cat "$$said" >&2; rm -f "$$said"; exit $$status
	@test -z "$$(git ls-files --unmerged)" || { echo "Conflict markers in: $$(git diff --name-only --diff-filter=U | sort -u | tr '\n' ' ')- resolve them, make test, commit." >&2; exit 1; }
	@test ! -f $(PACKAGE)/engine/rewrite_old_paths.py || $(BIN)/python -m $(PACKAGE).engine.rewrite_old_paths  # in your files
	@echo "Merged the template's newer version: review with git diff, run make test, commit."

install: $(INSTALLED) ## create .venv (PYTHON= picks the interpreter) and install the project with its dev tools (LOCKED=1: pinned; EXTRAS=mlflow,wandb: those too)
	$(if $(TORCH_SPEC)$(EXTRAS),@grep -qxF '$(TORCH_SPEC) $(EXTRAS)' $(INSTALLED) || $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST)) -B $(INSTALLED))

comma := ,

example-data: $(INSTALLED) ## write the examples' data under data/ (offline; with the hf extra, tiny Hugging Face models too)
	$(BIN)/python scripts/make_example_data.py $(ARGS)

train: $(INSTALLED) ## train CONFIG (default configs/default.yaml) with ARGS, then test the best checkpoint
	$(BIN)/python -m project fit --config $(CONFIG) $(ARGS)

predict: $(INSTALLED) ## predict with RUN's best.ckpt on the test split (or INPUT=: a file/folder its DataModule reads) -> CSV
	@test -n "$(RUN)" || { echo "error: give the run: make predict RUN=logs/<name>/version_<N> [INPUT=...] [OUTPUT=...]" >&2; exit 2; }
	$(BIN)/python -m project predict --config $(RUN)/config.yaml --ckpt_path $(RUN)/checkpoints/best.ckpt \
		$(if $(INPUT),--data.predict_path=$(INPUT)) \
		$(if $(OUTPUT),--trainer.callbacks+=project.engine.CSVPredictionWriter --trainer.callbacks.output=$(OUTPUT)) $(ARGS)

export: $(INSTALLED) ## export RUN's best.ckpt to model.onnx + model.pt2 (torch.export) with a parity check
	@test -n "$(RUN)" || { echo "error: give the run: make export RUN=logs/<name>/version_<N>" >&2; exit 2; }
	$(BIN)/python -m project.engine.inference.export $(RUN) $(ARGS)

profile: $(INSTALLED) ## profile 30 training steps of CONFIG (after 5 of warm-up; configs/profile.yaml stops at 40): <run>/trace.json and the top ops by self time
	$(BIN)/python -m project fit --config $(CONFIG) --config configs/profile.yaml \
		--trainer.callbacks+=project.engine.ProfileSteps $(ARGS)

train-ddp: $(INSTALLED) ## train CONFIG on every local GPU with DDP (2 processes on a CPU-only machine)
	$(BIN)/python -m project fit --config $(CONFIG) --config configs/ddp.yaml \
		--trainer.devices=$$($(BIN)/python -c "import torch; print(torch.cuda.device_count() or 2)") $(ARGS)

# RUN defaults to the run whose last.ckpt is newest.
resume: $(INSTALLED) ## continue RUN=logs/<name>/version_<N> (default: the latest) from its last.ckpt, in place
	@run="$(RUN)"; \
	if [ -z "$$run" ]; then ckpt=$$(ls -t logs/*/version_*/checkpoints/last.ckpt 2>/dev/null | head -n 1); \
		run=$${ckpt%/checkpoints/last.ckpt}; fi; \
	if [ -z "$$run" ] || [ ! -f "$$run/checkpoints/last.ckpt" ] || [ ! -f "$$run/config.yaml" ]; then \
		echo "error: no run to resume: RUN='$(RUN)' has no checkpoints/last.ckpt and config.yaml (looked under logs/ when RUN is empty)." >&2; \
		exit 2; fi; \
	echo "Resuming $$run"; \
	$(BIN)/python -m project fit --config "$$run/config.yaml" --ckpt_path "$$run/checkpoints/last.ckpt" $(ARGS)

sweep: $(INSTALLED) ## search the config keys SWEEP names with WORKERS processes (run again: continues the study)
	$(BIN)/python -m project.engine.sweep $(SWEEP) --workers $(WORKERS) $(ARGS)

sweep-status: $(INSTALLED) ## SWEEP's table of trials so far, best.yaml and plots (while it runs, or after)
	$(BIN)/python -m project.engine.sweep $(SWEEP) --status $(ARGS)

# --dist loadscope: a test file's tests share one process, so its module fixtures (a trained run) are built once.
PYTEST = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test: $(INSTALLED) ## what an edit to your tasks, data, nets, recipe or configs can break: the contract suite on each, the fast tests (~2 min on 2 cores)
	$(PYTEST) --durations=10 -m "not engine and not manual" $(ARGS)

test-all: test ## make test, then the engine's own proofs (DDP launches, sweeps, killed runs, SLURM, torchrun): what CI runs
	$(PYTEST) --durations=15 -m "engine and not manual" $(ARGS)

test-fast: $(INSTALLED) ## run the tests not marked slow
	$(PYTEST) -m "not slow and not manual" $(ARGS)

contract: $(INSTALLED) ## the contract suite (tests/test_contract.py) on CONFIG alone, e.g. CONFIG=configs/my_gan.yaml
	PROJECT_CONTRACT_CONFIG=$(CONFIG) $(PYTEST) -m "not manual" tests/test_contract.py $(ARGS)

# pip installs the lowest versions of what .venv has into .venv-minimum, which PYTHONPATH puts in front (nothing in .venv
# changes); the suite's subprocesses keep it in front too (tests/conftest.py).
test-minimum: $(INSTALLED) ## run the tests not marked slow (and those marked minimum) at the lowest versions pyproject.toml admits (constraints-minimum.txt; CI does)
	$(BIN)/python -c "import re; from importlib.metadata import distributions; \
		have = {re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() for d in distributions()}; \
		lines = re.findall(r'^(([\w.-]+)==\S+)$$', open('constraints-minimum.txt').read(), re.M); \
		open('$(VENV)/minimum.txt', 'w').write(''.join(f'{pin}\n' for pin, name in lines \
		if re.sub(r'[-_.]+', '-', name).lower() in have))"
	rm -rf .venv-minimum  # none left from an extra installed then, and since removed
	$(BIN)/pip install -q --no-deps --target .venv-minimum -r $(VENV)/minimum.txt
	PYTHONPATH=$(CURDIR)/.venv-minimum $(BIN)/python -c "from importlib.metadata import version; \
		pins = open('$(VENV)/minimum.txt').read().split(); \
		print('at the minimums:', *(f'{p} ({version(p.split(\"==\")[0])}),' for p in pins), 'torch', version('torch'))"
	PYTHONPATH=$(CURDIR)/.venv-minimum $(PYTEST) -m "(not slow or minimum) and not manual" $(ARGS)

check-manual: $(INSTALLED) ## the template's own checks of its manual and its shipped examples (its CI runs them)
	$(PYTEST) -m manual $(ARGS)

runs: $(INSTALLED) ## the table of every run under LOGS (default logs/): status, time, scores, what differs, commit
	@$(BIN)/python -m project.engine.observe.runs --logs $(LOGS) $(if $(NAME),--name $(NAME)) $(ARGS)

tensorboard: $(INSTALLED) ## serve LOGS (default logs/) on 127.0.0.1 (port from PORT, default 6006)
	@echo "TensorBoard: http://127.0.0.1:$(PORT)/#custom_scalars  (the curated charts; Time Series, HPARAMS: tabs)"
	$(BIN)/tensorboard --logdir $(LOGS) --host 127.0.0.1 --port $(PORT)

# The local tracking server for users without one: runs in logs/mlflow.db (the same store a run without
# MLFLOW_TRACKING_URI writes), artifacts under logs/mlflow-artifacts, loopback only. Without MLflow's job execution
# (its GenAI jobs: 8 more processes, 1.5 GB here), which tracking and the UI do not use.
mlflow: $(INSTALLED) ## serve an MLflow tracking server on 127.0.0.1:MLFLOW_PORT (default 5000): SQLite store and artifacts under logs/
	@$(BIN)/python -c "import mlflow" 2>/dev/null || $(BIN)/pip install $(CONSTRAINTS) -e '.[mlflow]'
	@mkdir -p logs
	@echo "MLflow: http://127.0.0.1:$(MLFLOW_PORT)  (runs log there with MLFLOW_TRACKING_URI=http://127.0.0.1:$(MLFLOW_PORT))"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(BIN)/mlflow server --backend-store-uri sqlite:///logs/mlflow.db \
		--artifacts-destination logs/mlflow-artifacts --host 127.0.0.1 --port $(MLFLOW_PORT)

lr-find: $(INSTALLED) ## Lightning's LR range test on CONFIG's task, data and optimizer: <run>/lr_find.png and the suggested lr (ARGS: --steps, --min_lr, --max_lr, flags)
	$(BIN)/python -m project.engine.run.lr_find --config $(CONFIG) $(ARGS)

bench: $(INSTALLED) ## the template's fit vs a hand-written PyTorch loop, same work: a table (+ benchmarks/results/*.json)
	$(BIN)/python benchmarks/bench.py $(ARGS)

notebooks: $(INSTALLED) ## open JupyterLab on 127.0.0.1 (installs jupyterlab into .venv on first use)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/pip install jupyterlab
	$(BIN)/jupyter lab --ip 127.0.0.1 --port $(PORT_NB) --notebook-dir notebooks

lint: $(INSTALLED) ## ruff check, ruff format --check, mypy on the package, the layout's import contracts
	$(BIN)/ruff check $(PACKAGE) tests benchmarks scripts
	$(BIN)/ruff format --check $(PACKAGE) tests benchmarks scripts
	$(BIN)/mypy $(PACKAGE)
	$(BIN)/lint-imports --no-cache

hooks: $(INSTALLED) ## install the git pre-commit hook (.pre-commit-config.yaml: make lint + notebook/large-file/conflict guards)
	$(BIN)/pre-commit install

# torch's local version (+cpu, +cu128) and CUDA-build-only packages are left out: the same file serves both builds.
lock: $(INSTALLED) ## write constraints.txt from .venv (after make test passes on new versions); make install LOCKED=1 uses it
	{ echo "# make lock wrote this from a .venv where make test passed; make install LOCKED=1 installs these."; \
	  $(BIN)/pip freeze --exclude-editable | sed -E 's/^(torch|torchvision)==([^+]*)\+.*/\1==\2/' \
		| grep -v -E '^(nvidia-|triton==|cuda-)'; } > constraints.txt

format: $(INSTALLED) ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix $(PACKAGE) tests benchmarks scripts
	$(BIN)/ruff format $(PACKAGE) tests benchmarks scripts

clean: ## remove caches and build leftovers (keeps logs/ and .venv/)
	rm -rf .pytest_cache .ruff_cache .mypy_cache build *.egg-info
	find . -path ./.venv -prune -o -name __pycache__ -type d -exec rm -rf {} +

clean-logs: ## delete every run under logs/
	rm -rf logs
