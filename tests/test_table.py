"""The table example (project/data/table.py): what a CSV or Parquet table gives, the class names and
categories it keeps, and one clear error for each bad input."""

import csv
import re
from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import numpy as np
import pytest
import torch

from project.data import CSVDataModule
from project.engine import ConfigError

pytestmark = [
    pytest.mark.guarantee(
        "the image folder and CSV DataModules keep class names, decode like predict, decode the same in worker "
        "processes, and refuse a bad folder, corrupt image, bad column or row naming it; `ResNet` takes any image "
        "size; a 29-line DataModule of your own trains and predicts"
    ),
]


def test_a_table_keeps_its_class_names_and_standardises_from_the_train_split(table_csv: Path) -> None:
    dm = CSVDataModule(path=str(table_csv), target="diagnosis")
    assert dm.target_names == ["benign", "malignant"] and dm.input_shape == (30,)
    dm.setup("fit")
    train, _ = dm.split_tensors("train")
    stats = dm.normalization
    assert stats is not None  # float64 sums against torch's two-pass std: equal to ~1e-15 relative
    assert stats["mean"] == pytest.approx(train.double().mean(0).tolist(), rel=1e-9)
    assert stats["std"] == pytest.approx(train.double().std(0, correction=0).tolist(), rel=1e-9)
    picked = CSVDataModule(path=str(table_csv), target="diagnosis", features=["mean_area", "mean_radius"])
    assert picked.input_shape == (2,)
    assert picked.inputs[0].tolist() == pytest.approx([1001.0, 17.99])  # the first row, in the order asked


def test_integer_labels_sort_numerically_and_predict_reads_columns_by_name(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("a,b,label\n" + "".join(f"{i},{-i},{[2, 10, 1][i % 3]}\n" for i in range(30)))
    dm = CSVDataModule(path=str(table), target="label")
    assert dm.target_names == ["1", "2", "10"] and dm.targets[:3].tolist() == [1, 2, 0]
    rows = tmp_path / "new.csv"
    rows.write_text("b,extra,a\n-5,x,5\n-7,y,7\n")  # another column order, an extra column, no label
    assert dm.load_predict_inputs(rows).tolist() == [[5.0, -5.0], [7.0, -7.0]]


def _churn_table(rare: int, rows: int = 60) -> dict[str, list]:
    """A table with two category columns and holes in a numeric one (every 7th row), with a category only in row
    ``rare``."""
    return {
        "plan": [["basic", "plus", "pro"][i % 3] if i != rare else "rare" for i in range(rows)],
        "contract": [["monthly", "yearly"][i % 2] for i in range(rows)],
        "income": [None if i % 7 == 3 else float(10 * i) for i in range(rows)],
        "age": [20 + i % 30 for i in range(rows)],
        "churn": [["no", "yes"][(i // 2) % 2] for i in range(rows)],
    }


def _write(folder: Path, columns: dict[str, list]) -> Path:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    pa_csv.write_csv(pa.table(columns), folder / "first.csv")
    return folder / "first.csv"


@pytest.mark.guarantee(
    "a table's categories and imputed values (medians, missing indicators) come from the training split alone; the "
    "same table as Parquet gives the same inputs bit for bit; an unseen category at predict encodes as none and is "
    "counted",
)
def test_categories_and_missing_values_are_learned_from_the_training_split_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    train, val, _ = CSVDataModule(path=str(_write(tmp_path, _churn_table(-1))), target="churn").split_indices(60)
    rare = val[0]  # the one row with the "rare" plan is a validation row: the category gets no input
    columns = _churn_table(rare)
    table = pa.table(columns)
    pa_csv.write_csv(table, tmp_path / "churn.csv")
    pq.write_table(table, tmp_path / "churn.parquet")
    dm = CSVDataModule(path=str(tmp_path / "churn.csv"), target="churn")
    assert dm.input_names == ["plan=basic", "plan=plus", "plan=pro", "contract=monthly", "contract=yearly",
                              "income", "income_missing", "age"]  # fmt: skip
    incomes = [columns["income"][i] for i in train if columns["income"][i] is not None]
    fill = float(np.median(incomes))  # the median of the training rows' known values, and of nothing else
    for i in (rare, 3, 11):
        plan, contract, income = columns["plan"][i], columns["contract"][i], columns["income"][i]
        want = [float(plan == p) for p in ("basic", "plus", "pro")] + [float(contract == "monthly"),
                float(contract == "yearly"), fill if income is None else income, float(income is None),
                columns["age"][i]]  # fmt: skip
        assert dm.inputs[i].tolist() == pytest.approx(want), i
    assert CSVDataModule(path=str(tmp_path / "churn.csv"), target="churn", exclude=["plan", "age"]).input_names == [
        "contract=monthly", "contract=yearly", "income", "income_missing"]  # fmt: skip
    # The same table as Parquet: the same inputs, bit for bit, and the same classes.
    parquet = CSVDataModule(path=str(tmp_path / "churn.parquet"), target="churn")
    assert torch.equal(parquet.inputs, dm.inputs) and parquet.target_names == dm.target_names == ["no", "yes"]
    assert torch.equal(parquet.targets, dm.targets)
    # Predict: a category training never saw is none of the known ones (all zeros), counted in one line.
    new = tmp_path / "new.csv"
    new.write_text("age,plan,contract,income\n30,gold,monthly,\n40,pro,yearly,5\n")
    got = dm.load_predict_inputs(new)
    assert got.tolist() == [[0, 0, 0, 1, 0, fill, 1, 30], [0, 0, 1, 0, 1, 5, 0, 40]]
    out = capsys.readouterr().out
    assert "1 of the 2 rows of" in out and "(plan: 'gold')" in out
    new.write_text("age,plan,contract,income\n30,pro,monthly,lots\n")
    with pytest.raises(ConfigError, match=re.escape("column 'income', row 2: 'lots' is not a number")):
        dm.load_predict_inputs(new)
    (tmp_path / "fake.parquet").write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match=re.escape("fake.parquet' is not a readable .parquet table")):
        dm.load_predict_inputs(tmp_path / "fake.parquet")


@pytest.mark.guarantee(
    "a table's prediction file carries its ID columns (or every column that is no input) as written, in input "
    "order, between `index` and the task's columns, for a predicted file and (`data.id_columns`) for the test "
    "split; `data.id_columns` keeps them out of the inputs"
)
def test_the_prediction_file_carries_the_id_columns_as_written_in_input_order(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from project.engine import CSVPredictionWriter

    columns = _churn_table(-1)
    columns["customer"] = [f"{i:05d}" for i in range(60)]  # IDs with leading zeros: text, not numbers
    path = _write(tmp_path, columns)
    dm = CSVDataModule(path=str(path), target="churn", id_columns=["customer"])
    assert "customer" not in dm.input_names  # an ID column is no input
    new = tmp_path / "new.csv"
    new.write_text("customer,age,plan,contract,income,prediction\n00042,30,pro,monthly,,a\n0007,40,basic,yearly,5,b\n")
    dm.load_predict_inputs(new)
    assert dm.predict_columns == {"customer": ["00042", "0007"]}
    default = CSVDataModule(path=str(path), target="churn", exclude=["customer"])
    default.load_predict_inputs(new)  # no id_columns: every column of the file that is no feature
    assert default.predict_columns == {"customer": ["00042", "0007"], "prediction": ["a", "b"]}
    # The writer puts them between the index and the task's columns, renaming one that clashes with the task's.
    dm.predict_set = default.predict_set = object()  # predicting on a file
    task = SimpleNamespace(prediction_table=lambda outputs: (["prediction"], [["yes"], ["no"]]),
                           write_prediction_files=lambda *args: None)  # fmt: skip
    writer = CSVPredictionWriter(str(tmp_path / "predictions.csv"))
    writer.write_on_epoch_end(
        SimpleNamespace(datamodule=default, callbacks=[writer], ckpt_path=None), task, [torch.zeros(2, 2)], []
    )  # type: ignore[arg-type]
    with open(tmp_path / "predictions.csv") as f:
        assert list(csv.reader(f)) == [["index", "customer", "input.prediction", "prediction"],
                                       ["0", "00042", "a", "yes"], ["1", "0007", "b", "no"]]  # fmt: skip
    (tmp_path / "no_id.csv").write_text("age,plan,contract,income\n30,pro,monthly,\n")
    with pytest.raises(ConfigError, match=re.escape("data.id_columns=['customer']: ['customer'] are not columns of")):
        dm.load_predict_inputs(tmp_path / "no_id.csv")


BAD_TABLES = {
    "missing-target": ("a,b\n1,2\n3,4\n", {"target": "label"}, "data.target='label': not column(s) of"),
    "not-a-number": ("a,b,label\n1,2,x\n3,oops,y\n", {"target": "label"}, "column 'b', row 3: 'oops' is not a number"),
    "nan": ("a,b,label\n1,2,x\n3,,y\n", {"target": "label", "missing": "refuse"}, "column 'b', row 3 is missing"),
    "one-class": ("a,label\n1,x\n2,x\n", {"target": "label"}, "holds 1 class(es), at least 2 needed"),
    "ragged": ("a,b,label\n1,2,x\n3,y\n", {"target": "label"}, "row 3 has 2 values, the header 3"),
    "unknown-feature": ("a,b,label\n1,2,x\n3,4,y\n", {"target": "label", "features": ["c"]}, "['c'] cannot be"),
    # A continuous target on the classification path: refused, naming the regression config (no 200-class run).
    "real-valued": ("a,y\n1,0.5\n2,1.25\n3,2\n", {"target": "y"}, "holds real numbers (e.g. 0.5), not class labels"),
    "many-integers": (
        "a,y\n" + "".join(f"{i},{i * 7}\n" for i in range(100)),
        {"target": "y"},
        "holds 100 distinct integers in 100 rows",
    ),
    "class-with-two-targets": ("a,y,z\n1,x,u\n2,y,v\n", {"target": ["y", "z"]}, "classification takes one target"),
    "id-column": (
        "id,label\n" + "".join(f"c{i},{'xy'[i % 2]}\n" for i in range(200)),
        {"target": "label"},
        "column 'id' holds 140 categories in the training split, more than data.max_categories=50",
    ),
    "one-category": ("a,b,label\n" + "1,u,x\n2,u,y\n" * 5, {"target": "label"}, "column 'b' holds one category"),
    "all-missing": ("a,b,label\n" + "1,,x\n2,,y\n" * 5, {"target": "label"}, "column 'b' is missing in every"),
    "a-target-cell-empty": ("a,label\n" + "1,x\n2,\n3,y\n" * 3, {"target": "label"}, "row 3: the target is missing"),
    "value-not-a-number": ("a,y\n1,x\n2,y\n", {"target": "y", "target_type": "value"}, "column 'y', row 2: 'x'"),
}


@pytest.mark.parametrize("case", BAD_TABLES)
def test_a_bad_table_is_refused_naming_the_column_and_row(case: str, tmp_path: Path) -> None:
    text, args, message = BAD_TABLES[case]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        CSVDataModule(path=str(path), **args)


@pytest.mark.guarantee(
    "`make bench`'s table workload reads one table two ways (pyarrow alone, the CSVDataModule's read and encoding) "
    "to the same rows and the closed-form count of encoded inputs"
)
def test_the_table_workload_reads_one_table_both_ways(tmp_path: Path) -> None:
    csv_path, parquet_path = bench.write_table(500, tmp_path)
    # 24 numbers, 3 of them with holes (an indicator each), and one-hot columns of 3 + 4 + 6 + 12 + 20 categories
    encoded = (500, 24 + 3 + 3 + 4 + 6 + 12 + 20)
    assert bench.load_table("pyarrow", str(csv_path))["shape"] == bench.load_table("pyarrow", str(parquet_path))[
        "shape"] == (500, 30)  # fmt: skip
    assert bench.load_table("template", str(csv_path))["shape"] == encoded
    assert bench.load_table("template", str(parquet_path))["shape"] == encoded


@pytest.mark.guarantee(
    "a table's prediction file carries its ID columns (or every column that is no input) as written, in input "
    "order, between `index` and the task's columns, for a predicted file and (`data.id_columns`) for the test "
    "split; `data.id_columns` keeps them out of the inputs"
)
def test_predictions_on_the_test_split_carry_its_rows_id_columns(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from project.engine import CSVPredictionWriter

    columns = _churn_table(-1)
    columns["customer"] = [f"{i:05d}" for i in range(60)]  # row i is customer i, leading zeros kept
    dm = CSVDataModule(path=str(_write(tmp_path, columns)), target="churn", id_columns=["customer"])
    dm.setup("test")
    test = list(dm.test_set.indices)  # type: ignore[union-attr]  (the test split's rows, in its order)
    assert dm.test_columns == {"customer": [f"{i:05d}" for i in test]}
    task = SimpleNamespace(prediction_table=lambda outputs: (["prediction"], [["p"]] * len(outputs)),
                           write_prediction_files=lambda *args: None)  # fmt: skip
    writer = CSVPredictionWriter(str(tmp_path / "predictions.csv"))
    writer.write_on_epoch_end(
        SimpleNamespace(datamodule=dm, callbacks=[writer], ckpt_path=None), task, [torch.zeros(len(test), 2)], []
    )  # type: ignore[arg-type]
    with open(tmp_path / "predictions.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["index", "customer", "prediction"]
    assert [row[1] for row in rows[1:]] == [f"{i:05d}" for i in test]
