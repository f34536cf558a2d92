"""The manifest (spark_imagenet.dataset.manifest): validation when it is read."""

from __future__ import annotations

import pytest

from data_util import build, small_layout
from spark_imagenet.errors import ManifestError
from spark_imagenet.dataset.manifest import Manifest


@pytest.fixture
def tree(tmp_path):
    return small_layout(tmp_path / "src", num_classes=5, train_per_class=9, val_per_class=3)


def test_manifest_validation(tree, tmp_path):
    out = tmp_path / "bucket"
    m = build(tree, out)
    data = m.to_json()
    data["format_version"] = 99
    with pytest.raises(ManifestError, match="format_version 99 is not supported"):
        Manifest.from_json(data)
    data = m.to_json()
    data["label_base"] = 1
    with pytest.raises(ManifestError, match="label_base"):
        Manifest.from_json(data)
    data = m.to_json()
    data["splits"]["train"]["examples"] += 1
    with pytest.raises(ManifestError, match="totals do not match"):
        Manifest.from_json(data)
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.loads("{", "x/manifest.json")
