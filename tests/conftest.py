import csv
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import project

if TYPE_CHECKING:
    import torch

    from project.engine import CLI

# torch, Lightning and the engine are imported by the test processes, when they collect the tests, and not by
# pytest-xdist's controller, which loads this file too: ~4.5 s before any test process could start.
PACKAGE = project.__name__  # the package's name (a repository of your own renames it)

ROOT = Path(__file__).resolve().parents[1]
DIGITS = str(ROOT / "tests" / "configs" / "digits.yaml")  # the engine tests' own config
USER_DEFAULT = str(ROOT / "configs" / "default.yaml")  # what the user selected: the contract suite runs it
DEBUG = str(ROOT / "configs" / "debug.yaml")
IMAGES = str(ROOT / "tests" / "configs" / "images.yaml")  # over DIGITS, with --data.root=<image_folder>
TABLE = str(ROOT / "tests" / "configs" / "table.yaml")  # over DIGITS, with --data.path=<table_csv>
REGRESSION = str(ROOT / "tests" / "configs" / "regression.yaml")  # over DIGITS, with --data.path=<regression_csv>
MULTILABEL = str(ROOT / "tests" / "configs" / "multilabel.yaml")  # over DIGITS, with --data.path=<tags_csv>
# What a subprocess of the suite imports: this checkout's package (not an installed one) and tests/ (probes), then
# what the suite's own PYTHONPATH puts first (make test-minimum: the lowest versions pyproject.toml admits).
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
LANGUAGE_MODEL = str(ROOT / "tests" / "configs" / "language_model.yaml")  # over DIGITS, --data.path=<text_corpus>
TEXT_CLASSES = str(ROOT / "tests" / "configs" / "text_classification.yaml")  # over DIGITS, --data.path=<lines_csv>
HF_TEXT_CLASSES = str(ROOT / "tests" / "configs" / "hf_text_classification.yaml")  # over DIGITS, with tiny_bert
SFT = str(ROOT / "tests" / "configs" / "sft.yaml")  # over DIGITS, with chats_jsonl and tiny_chat
TOKENS = str(ROOT / "tests" / "configs" / "tokens.yaml")  # over DIGITS: variable-length sequences (tests/tokens.py)
SEGMENTATION = str(ROOT / "tests" / "configs" / "segmentation.yaml")  # over DIGITS, --data.root=<segmentation_folder>
sys.path.insert(0, str(ROOT / "scripts"))  # make_example_data: the data the image and table fixtures use
sys.path.insert(0, str(ROOT / "benchmarks"))  # bench: what the bench's tests check

# What `make test ARGS=...` hands down: make exports its command-line variables and MAKEFLAGS to the recipe's
# environment, and a nested `make resume` would read them back (ARGS= pytest flags given to the CLI).
_MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR")
_MAKEFILE_VARIABLES = (
    "ARGS", "CONFIG", "RUN", "INPUT", "OUTPUT", "PORT", "PORT_NB", "PYTHON", "TORCH_SPEC", "SWEEP", "WORKERS",
    "TEST_WORKERS", "LOCKED", "NAME", "LOGS", "DEST", "KEEP", "TEMPLATE",
)  # fmt: skip


def _git_status() -> str | None:
    try:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None  # None: not a git checkout


def pytest_configure(config: pytest.Config) -> None:
    for name in (*_MAKE_ENV, *_MAKEFILE_VARIABLES):
        os.environ.pop(name, None)
    # Under `make test` (pytest-xdist) each test process gets its share of the cores, it and what it starts (a
    # notebook kernel): torch's default of one thread per core in every process oversubscribes the CPU, and
    # OpenMP threads waiting on each other then cost several times the work (62 s instead of 7 s for one test).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)
    config.stash[_STATUS] = _git_status()


_STATUS = pytest.StashKey[str | None]()

# `make test` (pytest-xdist, --dist loadscope --no-loadscope-reorder) hands out whole modules in collection order
# (xdist's own reorder, by number of tests, put a two-test module of a minute last). These run for minutes
# (processes: DDP ranks, sweep trials, killed runs); given out first, none of them starts last while the other
# worker idles, which had left the suite's wall time well above half its total. Names only: a module you deleted
# is no error, and the rest keep their order.
LONGEST_FIRST = ("test_contract", "test_ddp", "test_sweep", "test_crash_safety", "test_gpu_check",
                 "test_observability", "test_resume", "test_readme")  # fmt: skip


# Files whose parameters are units of their own for xdist, so they run side by side instead of one file on one worker:
# the contract suite (a parameter is a subject, whose module-scoped run its tests share) and files of long
# parametrized tests that share no module-scoped fixture.
SPLIT_BY_PARAMETER = ("test_contract", "test_resume", "test_trainer_flags")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByFileOrParameter(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            if Path(nodeid.split("::")[0]).stem in SPLIT_BY_PARAMETER and nodeid.endswith("]"):
                return f"{scope}[{nodeid.rsplit('[', 1)[1]}"
            return scope

    return ByFileOrParameter(config, log) if config.getoption("dist") == "loadscope" else None


# The two tiers. `make test` proves what an edit to a user room can break: the fast tests, the contract suite on your
# config and on each shipped example, the examples' own tests, the CLI as you run it. `make test-all` adds the engine's
# own proofs, which no such edit reaches: the slow tests of these files (processes, DDP launches, sweeps, killed runs,
# long runs on the engine's fixtures), and those marked `engine` elsewhere. Each slow test is in one tier or the other.
ENGINE_FILES = ("test_sweep", "test_ddp", "test_crash_safety", "test_trackers", "test_shapes", "test_observability",
                "test_trainer_flags", "test_mechanics", "test_host_work", "test_bench", "test_tokens",
                "test_provenance", "test_pretrained", "test_tasks", "test_classification", "test_config")  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.nodeid.split("::")[0]).stem in ENGINE_FILES and item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.engine)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.nodeid.split("::")[0]).stem, len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tests write only under their tmp_path: a checkout the suite changed fails the run, naming the files."""
    before, after = session.config.stash.get(_STATUS, None), _git_status()
    if before is not None and after is not None and after != before:
        changed = sorted(set(after.splitlines()) - set(before.splitlines()))
        print("\nerror: the tests changed the checkout (git status --porcelain):\n" + "\n".join(changed))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_scratch: Path | None = None


@pytest.fixture(scope="session", autouse=True)
def _scratch_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    global _scratch
    _scratch = tmp_path_factory.mktemp("scratch")
    # What a run caches by default (a text corpus's token file, under ~/.cache) lands in pytest's tree too, for
    # every test and the processes they start.
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes (circle, square, triangle) x 40 RGB 16x16 PNGs, one subfolder per class."""
    from make_example_data import write_shapes

    return write_shapes(tmp_path_factory.mktemp("data") / "shapes", per_class=40, size=16)


@pytest.fixture(scope="session")
def table_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's breast-cancer table as a CSV: 569 rows, 30 numeric features, target diagnosis."""
    from make_example_data import write_breast_cancer

    return write_breast_cancer(tmp_path_factory.mktemp("data") / "breast_cancer.csv")


@pytest.fixture(scope="session")
def regression_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's diabetes table as a CSV: 442 rows, 10 numeric features, a real-valued target progression."""
    from make_example_data import write_diabetes

    return write_diabetes(tmp_path_factory.mktemp("data") / "diabetes.csv")


@pytest.fixture(scope="session")
def tags_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 rows of 8 features and 3 yes/no tag columns (tag_a, tag_b, tag_c)."""
    from make_example_data import write_tags

    return write_tags(tmp_path_factory.mktemp("data") / "tags.csv")


@pytest.fixture(scope="session")
def segmentation_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 RGB 16x16 PNGs of 1-3 shapes in images/, their masks (0 background, 1 circle, 2 square, 3 triangle) in
    masks/, and classes.txt."""
    from make_example_data import write_segmentation

    return write_segmentation(tmp_path_factory.mktemp("data") / "segmentation", count=64, size=16)


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~100 KB of English and Python: the source of a few standard-library modules, as one text file."""
    import json
    import string
    import textwrap

    text = "\n".join(Path(m.__file__).read_text() for m in (textwrap, string, json.decoder, json.encoder))
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text(text[:100_000])
    return path


@pytest.fixture(scope="session")
def lines_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 lines of the standard library's source, 100 each of code, comment and docstring (text, label)."""
    from make_example_data import write_lines

    return write_lines(tmp_path_factory.mktemp("data") / "lines.csv", per_class=100)


@pytest.fixture(scope="session")
def tiny_bert(lines_csv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT and its WordPiece tokenizer learned from the lines, saved as a pretrained model is (the hf
    extra's; skipped without it)."""
    pytest.importorskip("transformers", reason="the hf extra is not installed (make install EXTRAS=hf)")
    pytest.importorskip("peft", reason="the hf extra is not installed (make install EXTRAS=hf)")
    from make_example_data import write_tiny_encoder

    with open(lines_csv, encoding="utf-8") as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    return write_tiny_encoder(tmp_path_factory.mktemp("hf") / "tiny-bert", texts)


@pytest.fixture(scope="session")
def chats_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 chats in JSON Lines: spell a word backwards, in capitals, or count its letters."""
    from make_example_data import write_chats

    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl")


@pytest.fixture(scope="session")
def tiny_chat(chats_jsonl: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with a byte-level BPE and a ChatML template, saved as a pretrained model is (the hf extra's)."""
    pytest.importorskip("transformers", reason="the hf extra is not installed (make install EXTRAS=hf)")
    pytest.importorskip("peft", reason="the hf extra is not installed (make install EXTRAS=hf)")
    from make_example_data import write_tiny_chat_model

    return write_tiny_chat_model(tmp_path_factory.mktemp("hf") / "tiny-chat", chats_jsonl.read_text().splitlines())


def default_data_missing(root: Path = ROOT, config: str | None = None) -> str | None:
    """Why the suite cannot run configs/default.yaml (or ``config``) here: it reads data this checkout lacks (data/ is
    git-ignored, so a fresh clone, CI's included, has none); None when it can."""
    import yaml

    data = (yaml.safe_load(Path(config or USER_DEFAULT).read_text()) or {}).get("data") or {}
    for key, value in (data.get("init_args") or {}).items():
        if key in ("path", "root") and value is not None and not (root / str(value)).exists():
            return (
                f"configs/default.yaml reads data.{key}={value!r}, which this checkout does not have (data/ is "
                "git-ignored): its contract checks run where the data is; for CI, commit a small sample (e.g. "
                f"tests/data/) and point data.{key} at it (docs/your-own.md, Make it yours)."
            )
    return None


def scratch_dir() -> Path:
    """A fresh empty directory inside pytest's temporary tree: the working directory of a subprocess."""
    return Path(tempfile.mkdtemp(prefix="cwd-", dir=_scratch))


@pytest.fixture(autouse=True)
def _work_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own tmp_path: a relative path written by mistake never lands in the checkout."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Lightning writes PL_GLOBAL_SEED and friends into os.environ; no test may see another's. Rich's global
    console (the progress bar's) is bound to the stdout of the test that first used it; each test gets its own."""
    import rich

    saved = dict(os.environ)
    rich._console = None
    yield
    rich._console = None
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread in this process, as in the suite's subprocesses (OMP_NUM_THREADS=1): a conv's sums
    depend on the thread count, so a run here is bitwise comparable with one a subprocess began only then."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def fit(save_dir: Path, *args: str, configs: tuple[str, ...] = (DIGITS,)) -> "CLI":
    """Run ``fit`` through the real CLI in this process, logging under ``save_dir``."""
    from project.engine import CLI

    argv = ["fit", *(a for c in configs for a in ("--config", c))]
    return CLI([*argv, f"--trainer.logger.init_args.save_dir={save_dir}", *args])


def warmup_cosine(step: int, peak: float, min_lr: float, warmup: int, total: int) -> float:
    """The default schedule's definition, written out independently of project/recipe.py."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return min_lr + (peak - min_lr) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - 1 - warmup)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_module(
    *args: str, timeout: float = 240, cwd: Path | None = None, warnings: bool = False, forked: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python -m project ...`` in a fresh process: the real entry point, or a real Lightning DDP launch.

    Loopback only, a fresh port per call, ``tests/`` importable (for ``probes``), and on timeout the whole
    process group (Lightning's launcher and the ranks it started) is killed, so a hang cannot stall the suite.
    It runs in ``cwd`` (default: a fresh empty directory), never in the checkout: whatever it writes by mistake
    into its working directory cannot land in the repository. ``warnings``: Python's warnings shown, as a user sees
    them (else ignored). ``forked``: forked from an interpreter that has imported torch, Lightning and the package
    (tests/preloaded.py), ~5 s of CPU less, for a run on one process whose imports are not what the test proves.
    """
    if forked:
        import preloaded

        logs = scratch_dir()
        proc: Any = preloaded.start(*args, env=_process_env(warnings), cwd=cwd or scratch_dir(),
                                    stdout=logs / "stdout", stderr=logs / "stderr")  # fmt: skip
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"timed out after {timeout}s: python -m project {' '.join(args)}")
        out, err = ((logs / name).read_text(errors="replace") for name in ("stdout", "stderr"))
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    proc = subprocess.Popen(
        [sys.executable, "-m", PACKAGE, *args],
        cwd=cwd or scratch_dir(),
        env=_process_env(warnings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = wait_or_kill(proc, timeout, f"python -m project {' '.join(args)}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _process_env(warnings: bool = False) -> dict[str, str]:
    """The environment of a process the suite starts: one thread, loopback with a fresh port, ``tests/`` importable."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "default" if warnings else "ignore",
        "PYTHONPATH": PYTHONPATH,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def run_ranks(*args: str, cwd: Path, world_size: int = 2, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m project ...`` as ``world_size`` DDP ranks forked from an interpreter that has imported torch,
    Lightning and the package already (tests/preloaded.py): what a task, data or net does under DDP, without the
    ~5 s each fresh rank spends on imports. Lightning's own launcher: ``run_module``."""
    import preloaded

    env, logs = _process_env(), scratch_dir()
    return preloaded.ranks(*args, world_size=world_size, env=env, cwd=cwd, logs=logs, timeout=timeout)


def wait_or_kill(proc: subprocess.Popen[str], timeout: float, what: str) -> tuple[str, str]:
    """``proc``'s (stdout, stderr); past ``timeout`` its whole process group (started with start_new_session) is
    killed and the test fails, naming ``what``: a hang cannot stall the suite."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {what}\n{(err or out or '')[-3000:]}")


def scalars(run: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run directory: {tag: [(step, value), ...]}."""
    from project.engine import read_scalars

    return read_scalars(run)


def accuracy(model: "torch.nn.Module", images: "torch.Tensor", labels: "torch.Tensor") -> float:
    """Reference accuracy computed by hand, in eval mode, on the whole split at once."""
    import torch

    model.eval()
    with torch.no_grad():
        return (model(images).argmax(dim=-1) == labels).float().mean().item()


# Ops whose result the host must read before it can go on: a value (.item(), a Python `if` on a tensor) or a shape
# that depends on the data (unique, nonzero, masked_select, bincount's length).
HOST_SYNCS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "_unique", "_unique2", "unique_dim",
              "unique_consecutive", "masked_select", "bincount"}  # fmt: skip


def offending_ops(offends: Any, step: Any) -> set[str]:
    """The ops torch dispatches while ``step()`` runs (the same ops on a CPU and a GPU) for which
    ``offends(func, args, kwargs)`` holds."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.offending: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if offends(func, args, kwargs or {}):
                self.offending.add(str(func))
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        step()
    return ops.offending
