"""The benchmark's quick mode: the hand-written loop and the template do the same work (not a speed test)."""

import itertools
from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import pytest
from conftest import DIGITS

pytestmark = [
    pytest.mark.guarantee(
        "the hand-written reference loop and the template do the same work (the same val acc; the same val RMSE on "
        "a regression; the language model's trajectory)"
    ),
]


@pytest.mark.slow
def test_reference_loop_and_template_do_the_same_work(tmp_path: Path) -> None:
    bench.write_spec(DIGITS, "default", 2, tmp_path / "spec.pt")  # the loop's data and recipe, from the template
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "default", epochs=2, save_dir=str(tmp_path))
    bare = bench.run_lightning(tmp_path / "spec.pt", scratch=str(tmp_path))  # built by hand, Lightning's callbacks
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
    # Bare Lightning carries the same logging and checkpointing (so the per-epoch gap is the template's own work).
    (root,) = tmp_path.glob("bench-lightning-*")
    assert {p.name for p in root.glob("*.ckpt")} == {"best.ckpt", "last.ckpt"}
    assert list(root.glob("bench/version_0/events.out.tfevents.*"))


@pytest.mark.slow
def test_the_decomposition_adds_one_part_per_row_and_every_row_learns_the_same_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    floor = bench.WORKLOADS["floor"]  # on batches of 64: 5 validation batches, not 34
    monkeypatch.setitem(bench.WORKLOADS, "floor", {"args": [*floor["args"], "--data.batch_size=64"], "epochs": 2})
    monkeypatch.setitem(bench.PARTS_LIMIT, "floor", 10)  # 10 steps per epoch: the rows are per step anyway
    found = bench.run_parts(DIGITS, "floor", rounds=1, out=str(tmp_path))
    parts = ["lightning", *(f"+{part}" for part in bench.PARTS), "template"]
    assert list(found) == ["reference", *parts, "template+EMA", "lightning+callbacks"]
    # Each row is the row above with one more of the template's parts; then the template whole; then, beside them,
    # bare Lightning with Lightning's own callbacks (what the template's per-step cost is judged against).
    has = [found[v]["has"] for v in parts[:-1]]
    assert has[0] == []
    for before, after, part in zip(has[:-1], has[1:], bench.PARTS, strict=True):
        assert sorted(after) == sorted([*before, part])
    assert set(bench.PARTS) < set(found["template"]["has"])
    # No part changes what is learnt (the progress bar, the logger and the checkpoints draw no random numbers), so
    # the rows compare the same work, the hand-written loop's included.
    learnt = {v: m["val_metric"] for v, m in found.items() if v != "template+EMA"}  # EMA validates its average
    assert len(set(learnt.values())) == 1, learnt
    assert found["template+EMA"]["has"] == [*found["template"]["has"], "EMA"]
    assert all(m["step_us"] > 0 and m["val_batch_us"] > 0 and m["cpu_step_us"] > 0 for m in found.values())
    # The noise-free figure: Python calls per step, for every Lightning row; each part adds calls or none.
    calls = [found[v]["calls_per_step"] for v in parts[:-1]]
    assert calls[0] > 100 and all(b >= a * 0.99 for a, b in itertools.pairwise(calls)), calls
    assert sorted(found["lightning+callbacks"]["has"]) == sorted(
        ["logger", "ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "TQDMProgressBar", "ModelSummary"]
    )
    assert found["lightning+callbacks"]["calls_per_step"] > calls[0]
