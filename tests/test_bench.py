"""The benchmark's quick mode: the hand-written loop and the template do the same work (not a speed test)."""

import sys
from pathlib import Path

import pytest
from conftest import DIGITS, REGRESSION, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench


@pytest.mark.slow
def test_reference_loop_and_template_do_the_same_work(tmp_path: Path) -> None:
    bench.write_spec(DIGITS, "default", 2, tmp_path / "spec.pt")  # the loop's data and recipe, from the template
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "default", epochs=2, save_dir=str(tmp_path))
    bare = bench.run_lightning(tmp_path / "spec.pt", scratch=str(tmp_path))  # built by hand, no callbacks
    assert reference["steps_per_epoch"] == template["steps_per_epoch"] == bare["steps_per_epoch"] == 20
    # Same network, init, data order, optimizer, schedule, clipping and dropout draws: the same model.
    assert template["val_metric"] == reference["val_metric"] == bare["val_metric"]
    assert reference["val_batches"] == template["val_batches"] == 5  # the val split batch by batch, both
    assert len(reference["ms_per_step"]) == len(template["ms_per_step"]) == 1
    # The split the bench reports: each epoch after the first has a steady-state part and a fixed part, and the
    # template's checkpoint saves (best.ckpt and last.ckpt, each epoch) are timed with their size.
    assert len(reference["epoch_fixed_ms"]) == len(template["epoch_fixed_ms"]) == 1
    # last.ckpt at both epoch ends, best.ckpt at the first and again if val/acc improved
    assert 3 <= len(template["saves"]) <= 4 and all(save["mb"] > 0 for save in template["saves"])


@pytest.mark.slow
def test_the_hand_written_loop_replays_the_regression_task_too(
    tmp_path: Path, regression_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench reads its workload's flags from WORKLOADS: here, the regression fixture over the engine's config.
    monkeypatch.setitem(bench.WORKLOADS, "regression", {"args": ["--config", REGRESSION,
                        f"--data.path={regression_csv}"], "epochs": 2})  # fmt: skip
    bench.write_spec(DIGITS, "regression", 2, tmp_path / "spec.pt")
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "regression", epochs=2, save_dir=str(tmp_path))
    assert reference["steps_per_epoch"] == template["steps_per_epoch"]
    # The same trajectory; val/rmse summed batch by batch (torchmetrics) vs over the whole split at once: float32
    # summation order alone, ~1e-7 relative per add over ~70 values. A wrong standardisation (or none) is O(1).
    assert template["val_metric"] == pytest.approx(reference["val_metric"], rel=1e-5)


@pytest.mark.slow
def test_the_decomposition_adds_one_part_per_row_and_every_row_learns_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    floor = bench.WORKLOADS["floor"]  # on batches of 64: 5 validation batches, not 34
    monkeypatch.setitem(bench.WORKLOADS, "floor", {"args": [*floor["args"], "--data.batch_size=64"], "epochs": 2})
    monkeypatch.setitem(bench.PARTS_LIMIT, "floor", 10)  # 10 steps per epoch: the rows are per step anyway
    found = bench.run_parts(DIGITS, "floor", rounds=1, out=str(tmp_path))
    assert list(found) == ["reference", "lightning", *(f"+{part}" for part in bench.PARTS), "template"]
    # Each row is the row above with one more of the template's parts; the last is the template whole.
    has = [found[v]["has"] for v in list(found)[1:-1]]
    assert has[0] == []
    for before, after, part in zip(has[:-1], has[1:], bench.PARTS, strict=True):
        assert sorted(after) == sorted([*before, part])
    assert set(bench.PARTS) < set(found["template"]["has"])
    # No part changes what is learnt (the progress bar, the logger and the checkpoints draw no random numbers), so
    # the rows compare the same work, the hand-written loop's included.
    assert len({m["val_metric"] for m in found.values()}) == 1, {v: m["val_metric"] for v, m in found.items()}
    assert all(m["step_us"] > 0 and m["val_batch_us"] > 0 and m["cpu_step_us"] > 0 for m in found.values())


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


def test_the_table_workload_reads_one_table_both_ways(tmp_path: Path) -> None:
    csv_path, parquet_path = bench.write_table(500, tmp_path)
    # 24 numbers, 3 of them with holes (an indicator each), and one-hot columns of 3 + 4 + 6 + 12 + 20 categories
    encoded = (500, 24 + 3 + 3 + 4 + 6 + 12 + 20)
    assert bench.load_table("pyarrow", str(csv_path))["shape"] == bench.load_table("pyarrow", str(parquet_path))[
        "shape"] == (500, 30)  # fmt: skip
    assert bench.load_table("template", str(csv_path))["shape"] == encoded
    assert bench.load_table("template", str(parquet_path))["shape"] == encoded
