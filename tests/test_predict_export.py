"""Using a trained model: a malformed input file gets a clear error, the export to ONNX and torch.export has parity
and a dynamic batch (on the engine tests' own task; each example's: tests/test_contract.py)."""

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEBUG, DIGITS, fit

from project.engine import ConfigError, main
from project.engine.inference.export import ParityError, export

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trained")
    fit(base, "--trainer.max_epochs=1", "--trainer.limit_train_batches=10", "--trainer.limit_test_batches=1.0",
        configs=(DIGITS, DEBUG))  # fmt: skip
    return base / "debug" / "version_0"


@pytest.fixture(scope="module")
def test_images(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from toy import Digits

    dm = Digits.load_from_checkpoint(run / "checkpoints" / "best.ckpt", weights_only=True)
    dm.setup("test")
    return dm.split_tensors("test")


def _predict(run: Path, *args: str) -> list[dict[str, str]]:
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}", *args])
    assert b"\r" not in (run / "predictions.csv").read_bytes()  # Unix line ends, as every other file of a run
    with open(run / "predictions.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.guarantee(
    "`python -m project test` (and `validate`) of a run's checkpoint prints every score of the checkpoint it names "
    "and writes nothing: no new run directory"
)
def test_a_test_of_a_checkpoint_prints_its_scores_and_writes_nothing(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    best = run / "checkpoints" / "best.ckpt"
    before = sorted(p for p in run.parent.parent.rglob("*") if p.is_file())
    for command, stage, what in (("test", "test", "Test"), ("validate", "val", "Validation")):
        capsys.readouterr()
        main([command, "--config", str(run / "config.yaml"), f"--ckpt_path={best}"])
        (said,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{what} of ")]
        assert said.startswith(f"{what} of {best}: {stage}/acc=") and f"{stage}/loss=" in said
    assert sorted(p for p in run.parent.parent.rglob("*") if p.is_file()) == before  # same files, none added


@pytest.mark.engine
@pytest.mark.guarantee("a malformed input file gets one sentence naming it and the expected shape")
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.zeros((5, 63), np.float32), "holds an array shaped (5, 63); expected N >= 1 samples shaped (1, 8, 8)"),
        (np.zeros((0, 64), np.float32), "holds an array shaped (0, 64); expected N >= 1 samples shaped (1, 8, 8)"),
        (None, "no such file or folder"),
    ],
    ids=["wrong-shape", "empty", "missing"],
)
def test_a_malformed_input_file_gets_a_clear_error(
    run: Path, tmp_path: Path, content: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.npy"
    if content is not None:
        np.save(path, content)
    with pytest.raises(SystemExit) as exit_info:
        _predict(run, f"--data.predict_path={path}")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"data.predict_path='{path}'" in err and message in err and "Traceback" not in err


@pytest.mark.engine
@pytest.mark.guarantee(
    "ONNX and torch.export models match the checkpoint (1e-4 of the outputs' scale) on the 32 test inputs the "
    "checkpoint keeps, at batch 1 and 32; a missing extra is named"
)
def test_export_round_trip_with_parity_and_a_dynamic_batch(run: Path, test_images: tuple) -> None:
    import onnxruntime
    from toy import Classifier

    checkpoint = run / "checkpoints" / "best.ckpt"
    metadata = export(checkpoint)
    out = checkpoint.parent
    assert json.loads((out / "model.json").read_text()) == metadata
    for name in ("onnx", "pt2"):
        assert metadata["parity"][name]["max_rel_diff"] <= 1e-4
    assert metadata["output"] == {"name": "outputs", "shape": ["batch", 10], "targets": [str(d) for d in range(10)]}
    # Independently of export(): both files, batch sizes 1 and 37, against the checkpoint's model.
    images, _ = test_images
    model = Classifier.load_from_checkpoint(checkpoint, weights_only=True).eval()
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    program = torch.export.load(out / "model.pt2").module()
    for n in (1, 37):
        with torch.inference_mode():
            expected = model(images[:n])
        onnx_logits = torch.from_numpy(session.run(None, {"inputs": images[:n].numpy()})[0])
        torch.testing.assert_close(onnx_logits, expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(program(images[:n]), expected, rtol=0, atol=1e-4)
    with pytest.raises(ParityError):  # the check bites: no tolerance is met by a negative bound
        export(checkpoint, tolerance=-1.0)


@pytest.mark.guarantee(
    "ONNX and torch.export models match the checkpoint (1e-4 of the outputs' scale) on the 32 test inputs the "
    "checkpoint keeps, at batch 1 and 32; a missing extra is named"
)
def test_export_without_the_extra_says_which_to_install(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[export\]'"):
        export(run / "checkpoints" / "best.ckpt")


@pytest.mark.engine
def test_predict_warns_of_nothing_it_does_on_purpose(run: Path) -> None:
    # Predict leaves the run's checkpoint callbacks out (so they neither restore nor write anything): Lightning's
    # warnings that they are missing, or that their directory changed, would be noise on every predict.
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _predict(run)
    noise = ("callbacks used to create the checkpoint", "dirpath has changed")
    assert not [str(w.message) for w in caught if any(n in str(w.message) for n in noise)]


def _same_rng(a: dict, b: dict) -> bool:
    """Two captures of every generator's state (checkpointing.rng's, which checkpoints hold) are equal."""
    numpy_same = torch.equal(a["numpy"]["key"], b["numpy"]["key"]) and a["numpy"]["pos"] == b["numpy"]["pos"]
    return torch.equal(a["torch"], b["torch"]) and a["python"] == b["python"] and numpy_same


@pytest.mark.guarantee(
    "a checkpoint's random state comes back only when `fit` resumes from it: `test`, `predict` and `export` of a "
    "checkpoint leave the process's random state as the same command without the checkpoint leaves it"
)
def test_only_a_resumed_fit_takes_the_checkpoints_random_state(run: Path) -> None:
    from project.engine import CLI
    from project.engine.checkpointing.rng import capture_rng_state

    best = run / "checkpoints" / "best.ckpt"
    for command in ("test", "predict"):
        # Each command seeds (seed_everything), builds the net (its init draws) and iterates a loader (a draw for
        # its base seed): with and without the checkpoint the same draws, so the same state after, unless loading
        # the checkpoint put the training run's saved state in place.
        CLI([command, "--config", str(run / "config.yaml")])
        without = capture_rng_state()
        CLI([command, "--config", str(run / "config.yaml"), f"--ckpt_path={best}"])
        assert _same_rng(capture_rng_state(), without), f"{command} with --ckpt_path changed the random state"
    before = capture_rng_state()
    export(best)
    assert _same_rng(capture_rng_state(), before), "export changed the random state"
