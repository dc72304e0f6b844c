"""The notebooks run top to bottom on a real Jupyter kernel on what configs/default.yaml selects, and are committed
without outputs (02 on a given run: tests/test_contract.py)."""

import os
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, USER_DEFAULT, default_data_missing
from nbclient import NotebookClient

from project.engine import CLI

pytestmark = [
    pytest.mark.guarantee(
        "both notebooks run top to bottom on a real kernel on what `configs/default.yaml` selects (02 also "
        "training a tiny run when there is none, and on a regression and a segmentation run); committed without "
        "outputs"
    ),
]

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there_and_committed_without_outputs() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_data_and_schedule.ipynb", "02_inspect_run.ipynb"]
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs: strip them"


def _execute(path: Path, env: dict[str, str]) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.update({**env, "OMP_NUM_THREADS": "1"})  # the kernel inherits this environment
    try:
        NotebookClient(
            notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return notebook


def _text(notebook: nbformat.NotebookNode) -> str:
    return "\n".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)


def _images(notebook: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in notebook.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.engine
@pytest.mark.slow
def test_data_and_schedule_notebook_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The notebook shows what configs/default.yaml selects, whatever that is: the expectation comes from there too,
    # built where the notebook builds it (in the repository: relative data paths mean what they mean for make).
    if why := default_data_missing():
        pytest.skip(why)
    monkeypatch.chdir(ROOT)
    dm = CLI(["--config", USER_DEFAULT], run=False).datamodule
    dm.setup("fit")
    inputs, _ = next(iter(dm.train_dataloader()))  # the notebook's first batch (variable lengths: padded per batch)
    batch = tuple(inputs.shape)
    notebook = _execute(ROOT / "notebooks" / "01_data_and_schedule.ipynb", {})
    assert _images(notebook) == 3  # sample grid, targets per split, LR curve: whatever the task
    assert f"inputs: {batch} {dm.input_dtype}" in _text(notebook)
    assert f"targets ({dm.target_kind}): {dm.target_names}" in _text(notebook)


@pytest.mark.engine
@pytest.mark.slow
def test_inspect_run_notebook_trains_a_tiny_run_when_there_is_none(tmp_path: Path) -> None:
    notebook = _execute(ROOT / "notebooks" / "02_inspect_run.ipynb", {"PROJECT_LOGS_DIR": str(tmp_path)})
    assert (tmp_path / "debug" / "version_0" / "checkpoints" / "best.ckpt").is_file()
    assert f"run: {tmp_path / 'debug' / 'version_0'}" in _text(notebook)
