"""The manual (README.md and its pages under docs/): what it names exists (tests it cites as proof, config files,
make targets, modules), and every command it shows runs."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import manual  # scripts/ (conftest puts it on the path)
import pytest
from conftest import ROOT

from project.engine.run.faults import PACKAGE

# The template's own manual, not yours: `make check-manual` (the template's CI) runs these, `make test` does not.
pytestmark = pytest.mark.manual

PAGES = {page.relative_to(ROOT): page.read_text() for page in manual.pages(ROOT)}
MANUAL = manual.text(ROOT)


def _test_names() -> dict[str, set[str]]:
    return {
        path.name: {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
        for path in (ROOT / "tests").glob("test_*.py")
    }


def test_every_test_the_manual_cites_exists() -> None:
    names, missing = _test_names(), []
    for page, text in PAGES.items():
        last = None
        # `test_x.py::name`, and the `...::name` that follow it in the same row (the same file).
        for match in re.finditer(r"`(test_\w+\.py)(?:::(\w+))?[^`]*`|`\.\.\.::(\w+)`", text):
            file, name = (match.group(1), match.group(2)) if match.group(1) else (last, match.group(3))
            last = file
            if file not in names or (name and name not in names[file]):
                missing.append(f"{page}: {file}::{name}" if name else f"{page}: {file}")
    assert not missing, f"the manual cites tests that do not exist: {missing}"


def test_every_config_file_the_manual_names_exists() -> None:
    configs = set(re.findall(r"(?<![\w/])(?:tests/)?configs/[\w/.-]+\.yaml\b", MANUAL))
    absent = sorted(c for c in configs if not (ROOT / c).is_file() and "mine" not in c and "my_" not in c)
    assert not absent, f"the manual names config files that do not exist: {absent}"


def test_every_make_target_the_manual_runs_exists() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):.*##", (ROOT / "Makefile").read_text(), re.M))
    code = re.findall(r"```bash\n(.*?)```", MANUAL, re.S) + re.findall(r"`([^`\n]+)`", MANUAL)  # commands only
    used = {m for block in code for m in re.findall(r"(?:^|\s)make ([a-z][\w-]*)", block, re.M)}
    assert used <= targets, f"the manual runs make targets the Makefile lacks: {sorted(used - targets)}"


def test_the_makefile_section_names_every_target_and_variable() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):.*##", makefile, re.M))
    variables = set(re.findall(r"^([A-Z_]+) \?=", makefile, re.M))
    _, section = manual.section(ROOT, "Makefile")
    named = set(re.findall(r"`([\w-]+)`", section))
    assert targets <= named and variables <= named, sorted((targets | variables) - named)


def test_every_link_between_the_manuals_pages_leads_to_a_page_and_heading_there() -> None:
    def anchor(title: str) -> str:  # as GitHub makes a heading's anchor
        return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")

    anchors = {page: {anchor(title) for _, _, title in manual.headings(text)} for page, text in PAGES.items()}
    broken = []
    for page, text in PAGES.items():
        for link in re.findall(r"\]\(((?!https?:)[^)\s]*)\)", re.sub(r"```.*?```", "", text, flags=re.S)):
            path, _, heading = link.partition("#")
            target = Path(os.path.normpath(page.parent / path)) if path else page
            # A page of the manual (and a heading of it), else a file or folder of the repository.
            leads = (not heading or heading in anchors[target]) if target in anchors else (ROOT / target).exists()
            if not leads:
                broken.append(f"{page}: {link}")
    assert not broken, f"links of the manual that lead nowhere: {broken}"


def test_every_module_the_manual_runs_or_imports_exists() -> None:
    modules = set(re.findall(rf"python -m ({PACKAGE}[\w.]*)", MANUAL)) | set(
        re.findall(rf"from ({PACKAGE}[\w.]*) import", MANUAL)
    )
    absent = [m for m in sorted(modules) if not (ROOT / (m.replace(".", "/") + ".py")).is_file()
              and not (ROOT / m.replace(".", "/") / "__init__.py").is_file()]  # fmt: skip
    assert not absent, f"the manual names modules that do not exist: {absent}"


def test_every_key_of_the_engines_task_and_datamodule_is_in_the_manual() -> None:
    """Each argument a config gives the engine's Task and DataModule base classes is named in the manual, so
    cutting its text never drops a key silently."""
    import inspect

    from project.engine import DataModule, Task

    absent = []
    for cls, section in ((Task, "model"), (DataModule, "data")):
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            # `name`, `model.name`, `--model.name=...`, `model.name: value`: the key in backticks
            if not re.search(rf"`(?:--)?(?:{section}\.(?:init_args\.)?)?{name}(?:[=: ][^`]*)?`", MANUAL):
                absent.append(f"{section}.{name}")
    assert not absent, f"keys of the engine's base classes the manual never names: {absent}"


# ---- Every command the manual shows, run as far as it goes without training ----------------------------------
#
# Each fenced shell line (and each command of the "Scaling out" table) runs for real in a scratch copy of the
# checkout's layout: `make` runs the real recipe, shell logic included, and the scripts run as they are, but every
# program they end in (python, pip, torchrun, srun, tensorboard, ...) is a stand-in that records its arguments.
# Each recorded command is then handed to its own parser: the project's CLI resolves it up to building the classes
# (every config file exists and composes, every key and value type-checks, the run length is known, a checkpoint
# fits), and the argparse tools parse their flags.
# The run directories the manual names (`logs/digits/version_0`, ...) are one short run trained here.

FAKE = """#!{python}
import json, os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps([name, args]) + "\\n")
# What a script reads back from its programs (slurm.sbatch's resolved config, make lock's freeze): the real thing.
if name == "python" and (args[:1] == ["-c"] or "--print_config" in args):
    os.execv({python!r}, [{python!r}, *args])
if name == "pip" and args[:1] == ["freeze"]:
    os.execv({python!r}, [{python!r}, "-m", "pip", *args])
"""
TOOLS = (
    "python",
    "pip",
    "tensorboard",
    "mlflow",
    "wandb",
    "jupyter",
    "ruff",
    "mypy",
    "pre-commit",
    "torchrun",
    "srun",
    "scontrol",
)


class _Parsed(Exception):
    pass


def _manual_commands() -> list[str]:
    lines = [
        line.split("  #")[0].split(" # ")[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", MANUAL, re.S)
        for line in block.splitlines()
    ]
    _, section = manual.section(ROOT, "Scaling out")
    scaling = "\n".join(line for line in section.splitlines() if line.startswith("|"))  # its table of launches
    lines += [c for c in re.findall(r"`([^`]+)`", scaling) if c.startswith(("make ", "python -m", "NNODES=", "sbatch"))]
    return [line for line in lines if line and not line.startswith("#") and "{" not in line]  # not the synopsis


def _checkout(tmp_path: Path) -> Path:
    """The checkout's layout with the manual's placeholders made real: run directories, your config, a sweep's
    best."""
    from conftest import fit

    checkout, fake = tmp_path / "checkout", tmp_path / "bin"
    fake.mkdir()
    checkout.mkdir()
    for name in ("configs", "benchmarks", "scripts"):  # copies: a command that writes (make lock) writes here
        shutil.copytree(ROOT / name, checkout / name, ignore=shutil.ignore_patterns("results", "__pycache__"))
    for name in ("pyproject.toml", "constraints.txt", "constraints-minimum.txt"):
        shutil.copy2(ROOT / name, checkout / name)
    for tool in TOOLS:
        (fake / tool).write_text(FAKE.format(python=sys.executable))
        (fake / tool).chmod(0o755)
    (checkout / ".venv" / "bin").mkdir(parents=True)  # what scripts/slurm.sbatch sources
    (checkout / ".venv" / "bin" / "activate").write_text(f'export PATH="{fake}:$PATH"\n')
    (tmp_path / "installed").touch()  # newer than pyproject.toml: make installs nothing
    run = Path(
        fit(tmp_path / "trained", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1").trainer.log_dir  # type: ignore[arg-type]
    )  # fmt: skip
    named = set(re.findall(r"\blogs/(\w+/version_\d+)", MANUAL))  # each run directory the manual names
    language_model = run
    if any(name.startswith("language_model/") for name in named):  # a language model's run: its own task
        from conftest import DIGITS, LANGUAGE_MODEL

        (tmp_path / "corpus.txt").write_text(Path(re.__file__).read_text())
        language_model = Path(
            fit(tmp_path / "trained", f"--data.path={tmp_path / 'corpus.txt'}", "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1",
                configs=(DIGITS, LANGUAGE_MODEL)).trainer.log_dir  # type: ignore[arg-type]
        )  # fmt: skip
    for trained in {run, language_model}:  # what `make resume` continues: a run interrupted, not one that finished
        record = trained / "provenance.json"
        record.write_text(record.read_text().replace('"status": "finished"', '"status": "interrupted by SIGINT"'))
    for name in named:
        (checkout / "logs" / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / "logs" / name).symlink_to(language_model if name.startswith("language_model/") else run)
    (checkout / "logs" / "sweeps" / "default").mkdir(parents=True)
    (checkout / "logs" / "sweeps" / "default" / "best.yaml").write_text((run / "config.yaml").read_text())
    for mine in ("my_config.yaml", "my.yaml"):  # your own base config: here, a copy of the shipped one
        (checkout / mine).write_text((ROOT / "configs" / "default.yaml").read_text())
    return checkout


def _record(line: str, checkout: Path, record: Path) -> None:
    """Runs one line of the manual with the stand-in programs; they append what they were asked to run to ``record``."""
    import shlex

    words = shlex.split(re.sub(r"<[^>]*>", "0", line))  # NODE_RANK=<0..N-1> MASTER_ADDR=<node 0>: node 0
    env = {**os.environ, "RECORD": str(record)}
    while "=" in words[0] and not words[0].startswith("-"):  # NNODES=2 ... scripts/torchrun.sh
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    fake = record.parent / "bin"
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    if words[0] == "make":
        words = [
            "make",
            "-f",
            str(ROOT / "Makefile"),
            *words[1:],
            f"BIN={fake}",
            f"INSTALLED={record.parent / 'installed'}",
        ]
    elif words[0] == "python":
        words = [str(fake / "python"), *words[1:]]
    elif words[0] == "sbatch":  # as sbatch starts it, on one node of two
        env.update(SLURM_SUBMIT_DIR=str(checkout), SLURM_JOB_ID="7", SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="4")
        words = ["bash", *words[1:]]
    else:
        words = ["bash", *words]
    result = subprocess.run(words, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{line}\n{result.stdout[-2000:]}{result.stderr[-2000:]}"


def _parse(name: str, args: list[str], checkout: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Hands one recorded command to its own parser; returns what it was (for the message of a failure)."""
    import argparse
    import contextlib
    import importlib.util
    import io

    from project.engine import CLI

    if name in ("srun", "torchrun"):  # the launchers run python: srun python -m ..., torchrun ... -m project
        args = args[1:] if name == "srun" else args[args.index("-m") :]
        name = "python"
    if name != "python" or args[:2] == ["-m", "pytest"] or args[0] == "-c":
        return (
            "not parsed"  # pip, tensorboard, jupyter, the linters, pytest: their own flags, as the Makefile writes them
        )
    monkeypatch.chdir(checkout)

    def parse_then_stop(self: argparse.ArgumentParser, argv: list[str] | None = None, namespace: object = None) -> None:
        raise _Parsed(original(self, argv, namespace))

    original, out = argparse.ArgumentParser.parse_args, io.StringIO()
    with pytest.raises((_Parsed, SystemExit)) as stopped, contextlib.redirect_stdout(out):
        if args[:2] == ["-m", "project"]:  # parsed, type-checked and past the CLI's own checks; nothing built
            monkeypatch.setattr(CLI, "instantiate_classes", lambda self: (_ for _ in ()).throw(_Parsed()))
            CLI(args[2:])
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)  # the argparse tools: parse only
        if args[0] == "-m":
            module = importlib.import_module(args[1])
            entry = module if hasattr(module, "main") else importlib.import_module(f"{args[1]}.__main__")
            entry.main(args[2:])
        else:  # a script: benchmarks/bench.py
            spec = importlib.util.spec_from_file_location("readme_script", checkout / args[0])
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            monkeypatch.setattr(sys, "argv", [args[0], *args[1:]])
            module.main()
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", original)
    assert stopped.type is _Parsed or stopped.value.code == 0, f"refused: {' '.join(args)}"
    return "parsed"


@pytest.mark.guarantee(
    "every command the manual shows (each fenced shell line of README.md and docs/, and each launch in Scaling "
    "out) runs: `make` with its real recipe and the scripts as they are, the programs they end in replaced by "
    "recorders, and each recorded command resolved by its own parser (the CLI up to building the classes: configs "
    "compose, keys type-check, the run length is known, a checkpoint fits)"
)
@pytest.mark.slow
def test_every_command_the_manual_shows_runs_and_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout, record = _checkout(tmp_path), tmp_path / "record.jsonl"
    commands = _manual_commands()
    assert len(commands) > 40 and "make train" in commands  # the extraction works
    problems, parsed = [], 0
    for line in commands:
        record.write_text("")
        try:
            _record(line, checkout, record)
            recorded = [json.loads(r) for r in record.read_text().splitlines()]
            assert recorded or line.startswith("make install"), f"{line}: ran nothing"  # installed already
            parsed += sum(_parse(name, args, checkout, monkeypatch) == "parsed" for name, args in recorded)
        except Exception as err:  # every line's problem is reported, not only the first one's
            problems.append(f"{line}: {str(err).splitlines()[0] if str(err) else err!r}")
    assert not problems, "commands of the manual that do not work:\n" + "\n".join(problems)
    assert parsed >= 35  # most lines end in a command that was resolved, not merely run
