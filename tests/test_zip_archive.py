"""The Kaggle zip read in place (spark_imagenet.source.zip_archive, both forms through shard): the same
dataset as from the folder, errors that name the zip and the member, refused archives."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from archive_util import DATA, build, cli, decoded, kaggle, tar_gz_of, zip_nested_form, zip_root_form, zip_with_links  # noqa: F401
from data_util import small_layout
from spark_imagenet.errors import ArchiveError, ImageError, LayoutError
from spark_imagenet.source.zip_archive import TAR_MEMBER


@pytest.mark.slow
def test_shards_from_both_zip_forms_equal_the_directory(kaggle, tmp_path):
    ref = build(kaggle["tree"], tmp_path / "dir")
    want = decoded(tmp_path / "dir", ref)
    assert len(want["train"]) == 24 and len(want["val"]) == 12
    for form in ("root", "top", "nested", "nested-top"):
        out = tmp_path / form
        m = build(kaggle[form], out)
        # Same images, labels and record order: the same dataset id and byte-identical shards.
        assert m.dataset_id == ref.dataset_id, form
        assert m.splits == ref.splits, form
        got = decoded(out, m)
        assert got == want, form
        assert m.source["kind"] == "kaggle-cls-loc-zip" and m.source["path"] == str(kaggle[form])
        assert m.source["form"] == ("nested-tar" if form.startswith("nested") else "root")
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["manifest.json", "quality-report.json"] + [s.name for sp in m.splits.values() for s in sp.shards])  # no spill files left
    assert json.loads((tmp_path / "top" / "manifest.json").read_text())["source"]["prefix"] == \
        "imagenet-object-localization-challenge/"
    # The labels are those of the tree: the train folder, and the first wnid of the val CSV row.
    wnids = [c.wnid for c in ref.classes]
    for r in want["train"]:
        assert r["image/filename"].decode().startswith(wnids[r["image/class/label"]] + "_")
    csv_rows = (kaggle["tree"] / "LOC_val_solution.csv").read_text().splitlines()[1:]
    first = {row.split(",")[0]: row.split(",")[1].split()[0] for row in csv_rows}
    for r in want["val"]:
        assert first[r["image/filename"].decode()[:-5]] == wnids[r["image/class/label"]]


@pytest.mark.slow
def test_selection_from_zips_equals_the_directory(kaggle, tmp_path):
    kw = dict(classes=2, per_class=4, seed=3, train_shards=2, val_shards=1)
    ref = build(kaggle["tree"], tmp_path / "dir", **kw)
    bz2 = zip_root_form(kaggle["tree"], tmp_path / "bz2.zip", compression=zipfile.ZIP_BZIP2)  # read via zipfile
    for form, z in (("root", kaggle["root"]), ("nested", kaggle["nested"]), ("bz2", bz2)):
        m = build(z, tmp_path / form, **kw)  # the stream stops once the chosen images are read
        assert m.dataset_id == ref.dataset_id and m.splits == ref.splits, form
    # A zip build into the folder of the directory build is the same dataset: nothing to do.
    again = build(kaggle["nested"], tmp_path / "dir", **kw)
    assert again.dataset_id == ref.dataset_id and again.source == ref.source


@pytest.mark.slow
def test_bad_images_inside_zips_are_listed_with_zip_and_member(tmp_path):
    """Both zip forms: an unusable image is listed with the zip and member (error) or skipped (skip), and a
    repairable one (a PNG named .JPEG) is stored repaired, as from a folder (tests/test_quality.py)."""
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=3, val_per_class=2)
    victim = tree.joinpath(*DATA, "train", "n90000001", "n90000001_2.JPEG")
    victim.write_bytes(victim.read_bytes()[:200])  # truncated
    png = io.BytesIO()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(png, "PNG")
    tree.joinpath(*DATA, "train", "n90000000", "n90000000_1.JPEG").write_bytes(png.getvalue())
    for form, make in (("root", zip_root_form), ("nested", zip_nested_form)):
        z = make(tree, tmp_path / f"{form}.zip")
        with pytest.raises(ImageError) as e:
            build(z, tmp_path / f"out-{form}", train_shards=2, val_shards=1)
        member = "ILSVRC/Data/CLS-LOC/train/n90000001/n90000001_2.JPEG"
        inner = f" member {TAR_MEMBER}" if form == "nested" else ""
        assert f"{z}{inner} member {member}: JPEG does not decode" in str(e.value)
        assert "n90000000_1.JPEG" not in str(e.value)  # repaired, not an error
        assert not (tmp_path / f"out-{form}").exists()
        m = build(z, tmp_path / f"out-{form}", train_shards=2, val_shards=1, on_corrupt="skip")
        report = json.loads((tmp_path / f"out-{form}" / "quality-report.json").read_text())
        assert [(f["file"], f["category"], f["action"]) for f in report["files"]] == [
            ("ILSVRC/Data/CLS-LOC/train/n90000000/n90000000_1.JPEG", "not_jpeg", "repaired"),
            (member, "corrupt", "skipped")]
        assert m.splits["train"].examples == 5 and m.selection["quality"]["train"]["skipped"] == 1


def test_corrupt_member_is_reported_not_stored(kaggle, tmp_path):
    z = tmp_path / "corrupt.zip"
    z.write_bytes(kaggle["top"].read_bytes())  # stored members: flip a byte inside one JPEG
    with zipfile.ZipFile(z) as zf:
        info = zf.getinfo("imagenet-object-localization-challenge/ILSVRC/Data/CLS-LOC/train/n90000002/n90000002_3.JPEG")
    data = bytearray(z.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + 500] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"corrupt.zip member .*n90000002_3.JPEG: cannot read \(CRC-32") as e:
        build(z, tmp_path / "out")
    assert str(e.value).startswith("1 file(s) could not be read; nothing was written")
    assert "A file that cannot be read is never left out" in str(e.value)
    # --on-corrupt skip leaves out images that do not decode, not a damaged member: it fails the same way, and
    # does not tell the user to pass the option they passed
    with pytest.raises(ImageError, match=r"n90000002_3.JPEG: cannot read \(CRC-32") as e:
        build(z, tmp_path / "out", on_corrupt="skip")
    assert "--on-corrupt skip leaves out images that do not decode, never a file that cannot be read" in str(e.value)
    assert "or pass --on-corrupt skip" not in str(e.value)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_layout_errors_name_the_zip_and_the_member(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=2, val_per_class=2)
    extra = tree.joinpath(*DATA, "val", "ILSVRC2012_val_00009999.JPEG")
    extra.write_bytes(next(tree.joinpath(*DATA, "val").iterdir()).read_bytes())
    z = zip_root_form(tree, tmp_path / "a.zip")
    with pytest.raises(LayoutError, match=rf"{z} member ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00009999.JPEG: "
                       rf"no row for ILSVRC2012_val_00009999 in {z} member LOC_val_solution.csv"):
        build(z, tmp_path / "out")
    extra.unlink()
    train = tree.joinpath(*DATA, "train")
    (train / "n90000001").rename(train / "n12345678")
    z = zip_nested_form(tree, tmp_path / "b.zip")
    with pytest.raises(LayoutError) as e:
        build(z, tmp_path / "out")
    assert f"{z} member {TAR_MEMBER} member ILSVRC/Data/CLS-LOC/train/n12345678/: folder is not a class" in str(e.value)
    assert f"{z} member {TAR_MEMBER} member ILSVRC/Data/CLS-LOC/train/n90000001/: missing" in str(e.value)
    (tree / "LOC_synset_mapping.txt").write_text("n90000000 a\nnot-a-wnid b\n")
    z = zip_root_form(tree, tmp_path / "c.zip")
    with pytest.raises(LayoutError, match=rf"{z} member LOC_synset_mapping.txt:2: expected '<wnid> <names>'"):
        build(z, tmp_path / "out")


def test_not_a_kaggle_zip_lists_what_is_missing(tmp_path):
    z = tmp_path / "photos.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("holiday/beach.jpg", b"x")
    with pytest.raises(ArchiveError) as e:
        build(z, tmp_path / "out")
    msg = str(e.value)
    assert f"{z} is not the Kaggle imagenet-object-localization-challenge archive; missing:" in msg
    for piece in ("LOC_synset_mapping.txt", "LOC_val_solution.csv", "ILSVRC/Data/CLS-LOC/train/",
                  "ILSVRC/Data/CLS-LOC/val/", TAR_MEMBER, "holiday/beach.jpg"):
        assert piece in msg, piece
    assert isinstance(e.value, LayoutError)
    assert not (tmp_path / "out").exists()
    # A tar.gz that does not hold ILSVRC/ is named too.
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(tree / "LOC_synset_mapping.txt", "readme.txt")
    z = zip_nested_form(tree, tmp_path / "empty-tar.zip", tar_bytes=buf.getvalue())
    with pytest.raises(ArchiveError, match=rf"member {TAR_MEMBER} is not the ImageNet tar.*missing:\n  "
                       r"ILSVRC/Data/CLS-LOC/train/\n  ILSVRC/Data/CLS-LOC/val/"):
        build(z, tmp_path / "out")


def test_truncated_archives_give_a_clear_error(kaggle, tmp_path):
    z = tmp_path / "half.zip"
    data = kaggle["root"].read_bytes()
    z.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match=rf"{z} is not a complete zip archive .*truncated or damaged\. "
                       r"Delete it and run spark-imagenet download again"):
        build(z, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty.zip").write_bytes(b"")
    with pytest.raises(ArchiveError, match=r"empty.zip is not a complete zip archive \(File is not a zip file; "
                                           r"0 bytes\): the file is truncated"):
        build(tmp_path / "empty.zip", tmp_path / "out")
    # With the client's resume marker beside it, the download is unfinished: download resumes it.
    Path(f"{z}.kaggle-partial").write_text("{}")
    with pytest.raises(ArchiveError, match=rf"{z} is not a complete zip archive .*Its download is not finished "
                       rf"\({z}.kaggle-partial is there\): run spark-imagenet download again .*it resumes"):
        build(z, tmp_path / "out")
    # An intact zip whose nested tar.gz is cut short: the stream error names the zip and the member.
    tar = tar_gz_of(kaggle["tree"])
    z = zip_nested_form(kaggle["tree"], tmp_path / "short-tar.zip", tar_bytes=tar[: len(tar) * 2 // 3])
    with pytest.raises(ArchiveError, match=rf"{z} member {TAR_MEMBER} cannot be read .*truncated or damaged"):
        build(z, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_shard_refuses_link_members_it_would_read(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=2, val_per_class=1)
    image = "ILSVRC/Data/CLS-LOC/train/n90000000/n90000000_9.JPEG"
    z = zip_with_links(tmp_path, "root", {image: "n90000000_1.JPEG"})
    with pytest.raises(ArchiveError) as e:
        build(z, tmp_path / "out")
    assert f"{z} holds 1 link member(s)" in str(e.value)
    assert f"\n  {image}: a symbolic link to n90000000_1.JPEG" in str(e.value)
    # The nested form: a symbolic link and a hard link in the tar's train folder.
    sym = tarfile.TarInfo(image)
    sym.type, sym.linkname = tarfile.SYMTYPE, "n90000000_1.JPEG"
    hard = tarfile.TarInfo("ILSVRC/Data/CLS-LOC/train/n90000001/n90000001_9.JPEG")
    hard.type, hard.linkname = tarfile.LNKTYPE, "ILSVRC/Data/CLS-LOC/train/n90000001/n90000001_1.JPEG"
    z = zip_nested_form(tree, tmp_path / "nested.zip", tar_bytes=tar_gz_of(tree, extra=[(sym, b""), (hard, b"")]))
    with pytest.raises(ArchiveError) as e:
        build(z, tmp_path / "out")
    msg = str(e.value)
    assert f"{z} member {TAR_MEMBER} holds 2 link member(s)" in msg and "the Kaggle archive has none" in msg
    assert f"\n  {hard.name}: a hard link to {hard.linkname}" in msg
    assert not (tmp_path / "out").exists()


def test_shard_of_a_missing_zip_says_it_does_not_exist(tmp_path):
    missing = tmp_path / "does-not-exist.zip"
    with pytest.raises(ArchiveError, match=rf"^{missing} does not exist: give the downloaded Kaggle zip"):
        build(missing, tmp_path / "out")
    p = cli("shard", str(missing), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and f"{missing} does not exist" in p.stderr and "not a directory" not in p.stderr


@pytest.mark.slow
def test_both_zip_forms_straight_to_a_bucket(kaggle, gcs_bucket, tmp_path):
    """`--out gs://...`: the stream form's spill files and shards live in the temp folder, then are uploaded."""
    from spark_imagenet.storage import open_storage

    ref = build(kaggle["tree"], tmp_path / "dir")
    for form in ("root", "nested"):
        url = f"gs://{gcs_bucket}/{form}"
        m = build(kaggle[form], url)
        assert m.dataset_id == ref.dataset_id and m.splits == ref.splits, form
        assert sorted(o.name for o in open_storage(url).list()) == sorted(
            ["manifest.json", "quality-report.json"] + [s.name for sp in m.splits.values() for s in sp.shards])



def test_zip_archive_does_not_import_tar_stream():
    """tar_stream builds on zip_archive; the package's open_zip_source, above both, picks the form (no cycle)."""
    import ast

    import spark_imagenet.source.zip_archive as zip_archive

    tree = ast.parse(Path(zip_archive.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any("tar_stream" in name for name in imported), imported


@pytest.mark.skipif(shutil.which("unzip") is None or shutil.which("tar") is None, reason="needs unzip and tar")
def test_cli_shard_from_the_zip_and_from_the_folder_unzip_gives(kaggle, tmp_path):
    """shard reads the zip as downloaded; the folder a newcomer unpacks with unzip (and, for the older form, tar)
    is the same dataset."""
    p = cli("shard", str(kaggle["nested"]), "--out", str(tmp_path / "z"), "--train-shards", "3", "--val-shards", "2",
            "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "pass 1 of 2" in p.stderr and "pass 2 of 2" in p.stderr
    assert "sharding 24 train + 12 val images of 4 classes into 3 + 2 shards" in p.stderr
    folder = tmp_path / "unpacked"
    subprocess.run(["unzip", "-q", str(kaggle["nested"]), "-d", str(folder)], check=True)
    subprocess.run(["tar", "-xzf", str(folder / TAR_MEMBER), "-C", str(folder)], check=True)
    (folder / TAR_MEMBER).unlink()
    p = cli("shard", str(folder), "--out", str(tmp_path / "z"), "--train-shards", "3", "--val-shards", "2")
    assert p.returncode == 0 and "already holds this dataset" in p.stderr, p.stderr  # same id as from the zip
