"""Reports about a dataset (spark_imagenet.dataset.report): the summary inspect prints, the quality report."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from data_util import small_layout
from spark_imagenet import inspect as public_inspect
from spark_imagenet.dataset.naming import QUALITY_REPORT_NAME
from spark_imagenet.dataset.report import format_quality, format_summary, inspect, quality_totals
from spark_imagenet.dataset.sharding import shard
from spark_imagenet.errors import ManifestError
from spark_imagenet.logs import collect

DATA = ("ILSVRC", "Data", "CLS-LOC")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A dataset with one repaired (CMYK) and one skipped (empty) train image."""
    base = tmp_path_factory.mktemp("report")
    tree = small_layout(base / "src", num_classes=3, train_per_class=4, val_per_class=2)
    train = tree.joinpath(*DATA, "train")
    cmyk = io.BytesIO()
    Image.new("CMYK", (20, 20), (10, 20, 30, 0)).save(cmyk, "JPEG")
    (train / "n90000001" / "n90000001_2.JPEG").write_bytes(cmyk.getvalue())
    (train / "n90000002" / "n90000002_3.JPEG").write_bytes(b"")
    out = base / "out"
    with collect() as lines:
        m = shard(tree, out, train_shards=2, val_shards=1, processes=1, on_corrupt="skip", progress=False)
    return out, m, lines


def test_inspect_reads_the_manifest_and_the_summary_shows_it(built):
    out, m, _ = built
    assert inspect(out) == m and public_inspect(str(out)) == m
    text = format_summary(m, str(out))
    lines = text.split("\n")
    assert lines[0] == f"dataset {out}" and lines[1] == f"  id        {m.dataset_id}"
    assert "  classes   3 (label base 0): 0=n90000000, 1=n90000001, 2=n90000002" in lines
    sizes = [s.examples for s in m.splits["train"].shards]
    assert f"  train     2 shards, 11 examples, {m.splits['train'].bytes / 1e6:.1f} MB " \
           f"({min(sizes)}-{max(sizes)} examples per shard)" in lines
    assert lines[-1].startswith("  total     17 examples, ")


def test_inspect_of_a_folder_without_a_manifest(tmp_path):
    with pytest.raises(ManifestError, match="does not exist: this is not a sharded dataset"):
        inspect(tmp_path)


def test_the_quality_report_reconciles_and_the_summary_lines(built):
    out, m, lines = built
    report = json.loads((out / QUALITY_REPORT_NAME).read_text())
    assert report["format"] == "spark-imagenet-quality-report" and report["format_version"] == 1
    assert report["dataset_id"] == m.dataset_id and report["on_corrupt"] == "skip"
    train = report["splits"]["train"]
    assert (train["files"], train["examples"], train["repaired"], train["skipped"]) == (12, 11, 1, 1)
    assert train["categories"]["cmyk"] == 1 and train["categories"]["empty"] == 1
    assert [(f["file"], f["action"]) for f in report["files"]] == [
        ("ILSVRC/Data/CLS-LOC/train/n90000001/n90000001_2.JPEG", "repaired"),
        ("ILSVRC/Data/CLS-LOC/train/n90000002/n90000002_3.JPEG", "skipped")]
    assert m.selection["quality"] == quality_totals(report)
    assert m.selection["quality"]["report"] == QUALITY_REPORT_NAME
    summary = format_quality(report)
    assert summary[0] == "image quality (train / val):"
    assert "  empty         1 / 0" in summary and "  cmyk          1 / 0" in summary
    # 12 train + 6 val files: 11 + 6 examples written, the empty one skipped
    assert summary[-1] == (f"  18 files found = 17 examples written + 1 skipped; 1 repaired (see {QUALITY_REPORT_NAME})")
    assert summary == [line for line in lines if line in summary]  # what shard printed
