"""Reading the Kaggle CLS-LOC layout: classes, train folders, val CSV quirks, and errors."""

from __future__ import annotations

import shutil

import pytest

from data_util import ILSVRC_MINI, requires_shared, small_layout
from spark_imagenet.errors import ConfigError, LayoutError
from spark_imagenet.source.folder import FolderSource
from spark_imagenet.source.layout import read_val_solution
from spark_imagenet.source.synset import read_synset_mapping, select_classes

DATA = ("ILSVRC", "Data", "CLS-LOC")


@pytest.fixture
def tree(tmp_path):
    return small_layout(tmp_path / "src")


def test_reads_classes_train_and_val(tree):
    src = FolderSource.open(tree).list_images()
    assert [c.wnid for c in src.classes] == ["n90000000", "n90000001", "n90000002", "n90000003"]
    assert [c.id for c in src.classes] == [0, 1, 2, 3]
    assert src.classes[0].names[0] == "red horizontal stripes"
    assert len(src.train) == 4 * 6 and len(src.val) == 4 * 3
    for img in src.train:
        assert f"/train/{img.wnid}/" in img.path and src.classes[img.label].wnid == img.wnid
    # Val labels come from the CSV (the folder is flat): check them against the CSV text.
    csv_text = (tree / "LOC_val_solution.csv").read_text().splitlines()[1:]
    first_wnid = {line.split(",")[0]: line.split(",")[1].split()[0] for line in csv_text}
    for img in src.val:
        assert first_wnid[img.filename[:-5]] == img.wnid == src.classes[img.label].wnid


def test_val_csv_quirks(tmp_path):
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text(
        "ImageId,PredictionString\n"
        "ILSVRC2012_val_00000001,n01751748 1 2 3 4 \n"  # trailing space
        "ILSVRC2012_val_00000002,n09193705 1 2 3 4 n01751748 5 6 7 8 n09193705 1 1 2 2\n"  # several boxes
        "\n"  # blank line
        "ILSVRC2012_val_00000003,n01751748 1 2 3 4\r\n"
    )
    labels = read_val_solution(csv, {"n01751748", "n09193705"})
    assert labels == {
        "ILSVRC2012_val_00000001": "n01751748",
        "ILSVRC2012_val_00000002": "n09193705",
        "ILSVRC2012_val_00000003": "n01751748",
    }


def test_csv_wnid_not_in_mapping_names_line(tmp_path):
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text("ImageId,PredictionString\nA,n01751748 1 2 3 4\nB,n99999999 1 2 3 4 \n")
    with pytest.raises(LayoutError, match=r"LOC_val_solution.csv:3: B: wnid n99999999 is not in LOC_synset_mapping.txt"):
        read_val_solution(csv, {"n01751748"})


def test_bad_header(tmp_path):
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text("id,label\nA,n01751748\n")
    with pytest.raises(LayoutError, match="expected the header"):
        read_val_solution(csv, {"n01751748"})


def test_not_a_layout_lists_what_is_missing(tmp_path):
    (tmp_path / "LOC_synset_mapping.txt").write_text("n01440764 tench\n")
    with pytest.raises(LayoutError) as e:
        FolderSource.open(tmp_path).list_images()
    msg = str(e.value)
    assert "LOC_val_solution.csv" in msg and "ILSVRC/Data/CLS-LOC/train/" in msg and "CLS-LOC/val/" in msg
    assert "LOC_synset_mapping.txt\n" not in msg  # present, so not listed


def test_val_image_without_csv_row(tree):
    extra = tree.joinpath(*DATA, "val", "ILSVRC2012_val_00009999.JPEG")
    shutil.copy(next(tree.joinpath(*DATA, "val").iterdir()), extra)
    with pytest.raises(LayoutError, match=r"ILSVRC2012_val_00009999.JPEG: no row for ILSVRC2012_val_00009999"):
        FolderSource.open(tree).list_images()


def test_csv_row_without_image(tree):
    victim = sorted(tree.joinpath(*DATA, "val").iterdir())[0]
    victim.unlink()
    with pytest.raises(LayoutError, match=f"row {victim.stem} has no image"):
        FolderSource.open(tree).list_images()


def test_empty_class_folder(tree):
    folder = tree.joinpath(*DATA, "train", "n90000002")
    for f in folder.iterdir():
        f.unlink()
    with pytest.raises(LayoutError, match=r"n90000002/: empty class folder"):
        FolderSource.open(tree).list_images()
    # Leaving the class out makes the tree usable again.
    src = FolderSource.open(tree).list_images(num_classes=2)
    assert {c.wnid for c in src.classes} == {"n90000000", "n90000001"}


def test_missing_and_unknown_class_folders(tree):
    train = tree.joinpath(*DATA, "train")
    train.joinpath("n90000001").rename(train / "n12345678")
    with pytest.raises(LayoutError) as e:
        FolderSource.open(tree).list_images()
    assert "n12345678/: folder is not a class" in str(e.value)
    assert "n90000001/: missing" in str(e.value)


def test_selection_classes_list_and_per_class(tree, tmp_path):
    src = FolderSource.open(tree).list_images(num_classes=2)
    assert [c.wnid for c in src.classes] == ["n90000000", "n90000001"]
    assert {i.wnid for i in src.val} == {"n90000000", "n90000001"} and len(src.val) == 6

    lst = tmp_path / "classes.txt"
    lst.write_text("# two classes\nn90000003\nn90000001, n90000003\n")
    src = FolderSource.open(tree).list_images(class_list=lst)
    # Mapping order, renumbered from 0; duplicates collapse.
    assert [(c.id, c.wnid) for c in src.classes] == [(0, "n90000001"), (1, "n90000003")]
    assert {(i.label, i.wnid) for i in src.train} == {(0, "n90000001"), (1, "n90000003")}

    a = FolderSource.open(tree).list_images(per_class=4, seed=7)
    b = FolderSource.open(tree).list_images(per_class=4, seed=7)
    c = FolderSource.open(tree).list_images(per_class=4, seed=8)
    assert a.train == b.train
    assert len(a.train) == 16
    assert a.train != c.train  # the seed changes which 4 are chosen (6 choose 4 per class)


def test_selection_errors(tree, tmp_path):
    with pytest.raises(ConfigError) as e:
        FolderSource.open(tree).list_images(num_classes=5)
    assert (e.value.key, e.value.value) == ("--classes", 5)
    lst = tmp_path / "classes.txt"
    lst.write_text("n90000001\nn11111111\n")
    with pytest.raises(ConfigError) as e:
        FolderSource.open(tree).list_images(class_list=lst)
    assert (e.value.key, e.value.value) == ("--class-list", ["n11111111"])
    lst.write_text("tench\n")
    with pytest.raises(ConfigError, match=r"classes.txt:1: 'tench' is not a wnid") as e:
        FolderSource.open(tree).list_images(class_list=lst)
    assert e.value.key == "--class-list"
    with pytest.raises(ConfigError) as e:
        select_classes(read_synset_mapping(tree / "LOC_synset_mapping.txt"), 2, ["n90000001"])
    assert (e.value.key, e.value.value) == ("--class-list", ["n90000001"])


def test_bad_mapping_line(tmp_path):
    m = tmp_path / "LOC_synset_mapping.txt"
    m.write_text("n01440764 tench, Tinca tinca\ngoldfish\n")
    with pytest.raises(LayoutError, match=r"LOC_synset_mapping.txt:2"):
        read_synset_mapping(m)


@requires_shared(ILSVRC_MINI)
def test_real_ilsvrc_mini():
    src = FolderSource.open(ILSVRC_MINI).list_images()
    assert len(src.classes) == 100
    assert len(src.train) == 1200 and len(src.val) == 300
    assert src.classes[0].wnid == "n01440764" and "tench" in src.classes[0].names
    assert {i.label for i in src.val} == set(range(100))
