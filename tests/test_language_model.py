"""The language-model example (project/tasks/language_model.py, project/data/text.py, project/gpt.py) beyond the
contract suite's checks of it: the bench's hand-written loop (nanoGPT's) replays its training."""

from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import pytest
from conftest import DIGITS


@pytest.mark.slow
def test_the_hand_written_loop_replays_the_language_model_too(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from conftest import LANGUAGE_MODEL

    args = ["--config", LANGUAGE_MODEL, f"--data.path={text_corpus}", "--trainer.limit_train_batches=5"]
    monkeypatch.setitem(bench.WORKLOADS, "text", {"args": args, "epochs": 2})
    bench.write_spec(DIGITS, "text", 2, tmp_path / "spec.pt", limit=5)
    spec = torch.load(tmp_path / "spec.pt", weights_only=True)
    assert spec["tokens_per_sample"] == 32 and spec["flops_per_step"] > 0
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "text", epochs=2, save_dir=str(tmp_path))
    assert reference["steps_per_epoch"] == template["steps_per_epoch"] == 5
    # The same trajectory (init, data order, dropout draws): the template's step is the sum of the token losses
    # over their count, the loop's their mean (nanoGPT's), equal in exact arithmetic; float32 rounds the two
    # reductions differently (~1e-7 relative), which 10 AdamW steps (each moving a weight by at most ~lr) keep
    # far below 1e-4 (a transformer amplifies it over hundreds of steps: 1.6e-3 after 174 measured, so the run is
    # short). A misweighted token or a lost step is O(1e-2).
    assert template["val_metric"] == pytest.approx(reference["val_metric"], rel=1e-4)
