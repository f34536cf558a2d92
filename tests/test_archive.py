"""The Kaggle zip read in place (both forms) and unpacked safely: real zips and tar.gz files built in tmp_path."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from PIL import Image

from archive_util import parse_example, tar_gz_of, tree_files, zip_nested_form, zip_root_form
from data_util import small_layout
from spark_imagenet.archive import TAR_MEMBER, extract
from spark_imagenet.errors import ArchiveError, ConfigError, ImageError, LayoutError
from spark_imagenet.shard import shard
from spark_imagenet.tfrecord import read_records

DATA = ("ILSVRC", "Data", "CLS-LOC")
QUIET = dict(processes=2, progress=False, log=lambda m: None)


def build(source, out, **kw):
    kw.setdefault("train_shards", 3)
    kw.setdefault("val_shards", 2)
    return shard(source, out, **QUIET, **kw)


def decoded(out: Path, manifest) -> dict[str, list[dict]]:
    """Per split, every record of every shard decoded, in shard and record order."""
    result = {}
    for split, info in manifest.splits.items():
        records = []
        for s in info.shards:
            with open(out / s.name, "rb") as f:
                records += [parse_example(r) for r in read_records(f)]
        result[split] = records
    return result


@pytest.fixture(scope="module")
def kaggle(tmp_path_factory):
    """One small tree (val images, LOC_val_solution.csv, test images) and its two zip forms."""
    base = tmp_path_factory.mktemp("archive")
    tree = small_layout(base / "kaggle", num_classes=4, train_per_class=6, val_per_class=3)
    return {
        "tree": tree,
        "root": zip_root_form(tree, base / "root.zip"),  # deflated members
        "top": zip_root_form(tree, base / "top.zip", prefix="imagenet-object-localization-challenge/",
                             compression=zipfile.ZIP_STORED, folders=True),
        "nested": zip_nested_form(tree, base / "nested.zip"),
        # the tar as `tar czf x.tar.gz .` names it, the zip's content in a top folder
        "nested-top": zip_nested_form(tree, base / "nested-top.zip", prefix="top/",
                                      tar_bytes=tar_gz_of(tree, top="./ILSVRC")),
    }


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
            ["manifest.json"] + [s.name for sp in m.splits.values() for s in sp.shards])  # no spill files left
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


def test_bad_images_inside_zips_are_listed_with_zip_and_member(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=3, val_per_class=2)
    victim = tree.joinpath(*DATA, "train", "n90000001", "n90000001_2.JPEG")
    png = io.BytesIO()
    Image.new("RGB", (20, 20)).save(png, "PNG")
    victim.write_bytes(png.getvalue())
    for form, make in (("root", zip_root_form), ("nested", zip_nested_form)):
        z = make(tree, tmp_path / f"{form}.zip")
        with pytest.raises(ImageError) as e:
            build(z, tmp_path / f"out-{form}", train_shards=2, val_shards=1)
        member = "ILSVRC/Data/CLS-LOC/train/n90000001/n90000001_2.JPEG"
        inner = f" member {TAR_MEMBER}" if form == "nested" else ""
        assert f"{z}{inner} member {member}: not a JPEG file (a PNG image named like one)" in str(e.value)
        assert not (tmp_path / f"out-{form}").exists()


def test_corrupt_member_is_reported_not_stored(kaggle, tmp_path):
    z = tmp_path / "corrupt.zip"
    z.write_bytes(kaggle["top"].read_bytes())  # stored members: flip a byte inside one JPEG
    with zipfile.ZipFile(z) as zf:
        info = zf.getinfo("imagenet-object-localization-challenge/ILSVRC/Data/CLS-LOC/train/n90000002/n90000002_3.JPEG")
    data = bytearray(z.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + 500] ^= 0xFF
    z.write_bytes(bytes(data))
    with pytest.raises(ImageError, match=r"corrupt.zip member .*n90000002_3.JPEG: cannot read \(CRC-32"):
        build(z, tmp_path / "out")


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
    for call in (lambda: build(z, tmp_path / "out"), lambda: extract(z, tmp_path / "dest", progress=False)):
        with pytest.raises(ArchiveError) as e:
            call()
        msg = str(e.value)
        assert f"{z} is not the Kaggle imagenet-object-localization-challenge archive; missing:" in msg
        for piece in ("LOC_synset_mapping.txt", "LOC_val_solution.csv", "ILSVRC/Data/CLS-LOC/train/",
                      "ILSVRC/Data/CLS-LOC/val/", TAR_MEMBER, "holiday/beach.jpg"):
            assert piece in msg, piece
    assert isinstance(e.value, LayoutError)
    assert not (tmp_path / "out").exists() and not (tmp_path / "dest").exists()
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
    for call in (lambda: build(z, tmp_path / "out"), lambda: extract(z, tmp_path / "dest", progress=False)):
        with pytest.raises(ArchiveError, match=rf"{z} is not a complete zip archive .*truncated.*Download it again"):
            call()
    assert not (tmp_path / "out").exists() and not (tmp_path / "dest").exists()
    # An intact zip whose nested tar.gz is cut short: the stream error names the zip and the member.
    tar = tar_gz_of(kaggle["tree"])
    z = zip_nested_form(kaggle["tree"], tmp_path / "short-tar.zip", tar_bytes=tar[: len(tar) * 2 // 3])
    with pytest.raises(ArchiveError, match=rf"{z} member {TAR_MEMBER} cannot be read .*truncated or damaged"):
        build(z, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _same_tree(a: Path, b: Path) -> None:
    files_a, files_b = tree_files(a), tree_files(b)
    assert [p.relative_to(a) for p in files_a] == [p.relative_to(b) for p in files_b]
    for x, y in zip(files_a, files_b):
        assert x.read_bytes() == y.read_bytes(), x


def test_extract_both_forms_gives_the_tree_shard_reads(kaggle, tmp_path):
    ref = build(kaggle["tree"], tmp_path / "ref")
    root = extract(kaggle["root"], tmp_path / "a", progress=False, log=lambda m: None)
    assert root == tmp_path / "a"
    _same_tree(kaggle["tree"], root)
    nested = extract(kaggle["nested"], tmp_path / "b", progress=False, log=lambda m: None)
    assert nested == tmp_path / "b" and not (nested / TAR_MEMBER).exists()
    _same_tree(kaggle["tree"], nested)
    top = extract(kaggle["top"], tmp_path / "c", progress=False, log=lambda m: None)
    assert top == tmp_path / "c" / "imagenet-object-localization-challenge"
    _same_tree(kaggle["tree"], top)
    top = extract(kaggle["nested-top"], tmp_path / "d", progress=False, log=lambda m: None)
    assert top == tmp_path / "d" / "top"
    _same_tree(kaggle["tree"], top)
    assert not any(p.name.endswith(".spark-imagenet-partial") for p in (tmp_path / "b").rglob("*"))
    m = build(nested, tmp_path / "from-extracted")
    assert m.dataset_id == ref.dataset_id and m.splits == ref.splits
    # A rerun keeps what is there (same sizes) and writes nothing.
    before = {p: p.stat().st_mtime_ns for p in tree_files(nested)}
    msgs = []
    extract(kaggle["nested"], tmp_path / "b", progress=False, log=msgs.append)
    assert {p: p.stat().st_mtime_ns for p in tree_files(nested)} == before
    assert "0 bytes written" in msgs[-1]


def _valid_zip_with(tmp_path: Path, name: str, extra: dict[str, bytes], **info) -> Path:
    tree = small_layout(tmp_path / f"kaggle-{name}", num_classes=2, train_per_class=1, val_per_class=1)
    z = zip_root_form(tree, tmp_path / f"{name}.zip")
    with zipfile.ZipFile(z, "a") as zf:
        for member, data in extra.items():
            zi = zipfile.ZipInfo(member)
            for k, v in info.items():
                setattr(zi, k, v)
            zf.writestr(zi, data)
    return z


@pytest.mark.parametrize("member, reason", [
    ("../evil.txt", "a '..' component"),
    ("ILSVRC/../../evil.txt", "a '..' component"),
    ("/tmp/spark-imagenet-zip-slip-test.txt", "an absolute path"),
])
def test_extract_refuses_zip_slip(tmp_path, member, reason):
    z = _valid_zip_with(tmp_path, "slip", {member: b"gotcha"})
    dest = tmp_path / "dest" / "inner"
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False, log=lambda m: None)
    msg = str(e.value)
    assert f"{member}: {reason}" in msg and "nothing was written" in msg and str(dest) in msg
    assert not (tmp_path / "dest").exists()  # nothing inside DEST, not even DEST
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/spark-imagenet-zip-slip-test.txt").exists()


def test_extract_refuses_a_zip_symlink_out_of_dest(tmp_path):
    z = _valid_zip_with(tmp_path, "link", {"ILSVRC/escape": b"../../../etc"},
                        external_attr=(stat.S_IFLNK | 0o777) << 16)
    with pytest.raises(ArchiveError, match=r"ILSVRC/escape: a symbolic link to \.\./\.\./\.\./etc, outside"):
        extract(z, tmp_path / "dest", progress=False, log=lambda m: None)
    assert not (tmp_path / "dest").exists()
    # A link that stays inside is made as a link.
    z = _valid_zip_with(tmp_path, "inner-link", {"ILSVRC/cls-loc": b"Data/CLS-LOC"},
                        external_attr=(stat.S_IFLNK | 0o777) << 16)
    root = extract(z, tmp_path / "ok", progress=False, log=lambda m: None)
    assert os.readlink(root / "ILSVRC" / "cls-loc") == "Data/CLS-LOC" and (root / "ILSVRC" / "cls-loc" / "val").is_dir()


def test_extract_refuses_tar_slip_in_the_nested_form(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    evil = tarfile.TarInfo("ILSVRC/../../evil.txt")
    evil.size = 6
    up = tarfile.TarInfo("../up.txt")
    up.size = 6
    sym = tarfile.TarInfo("ILSVRC/etc")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc"
    hard = tarfile.TarInfo("ILSVRC/passwd")
    hard.type, hard.linkname = tarfile.LNKTYPE, "../../etc/passwd"
    fifo = tarfile.TarInfo("ILSVRC/pipe")
    fifo.type = tarfile.FIFOTYPE
    tar = tar_gz_of(tree, extra=[(evil, b"gotcha"), (up, b"gotcha"), (sym, b""), (hard, b""), (fifo, b"")])
    z = zip_nested_form(tree, tmp_path / "slip.zip", tar_bytes=tar)
    with pytest.raises(ArchiveError) as e:
        extract(z, tmp_path / "dest", progress=False, log=lambda m: None)
    msg = str(e.value)
    assert f"member {TAR_MEMBER}: refused to extract 5 unsafe member(s)" in msg and "tar-slip" in msg
    assert "ILSVRC/../../evil.txt: a '..' component" in msg and "../up.txt: a '..' component" in msg
    assert "ILSVRC/etc: a symbolic link to the absolute path /etc" in msg
    assert "ILSVRC/passwd: a '..' component" in msg  # the hard link's target
    assert "ILSVRC/pipe: a device, FIFO or other special file" in msg
    assert not (tmp_path / "dest").exists() and not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "up.txt").exists()


def test_extract_checks_free_space_first(tmp_path):
    # A real zip whose central directory declares a 32 TiB member (the data written is 1 byte).
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    z = zip_root_form(tree, tmp_path / "huge.zip")
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr("ILSVRC/Data/CLS-LOC/test/huge.JPEG", b"x")
        zf.filelist[-1].file_size = 2**45
    assert z.stat().st_size < 1_000_000
    dest = tmp_path / "new" / "dest"
    with pytest.raises(ConfigError) as e:
        extract(z, dest, progress=False, log=lambda m: None)
    msg = str(e.value)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    need = 2**45 + sum(p.stat().st_size for p in tree_files(tree))
    assert f"not enough free space to extract {z}: it needs {need} bytes" in msg
    assert f"{tmp_path} has " in msg and "32768.0 GiB" in msg
    free_in_msg = int(msg.split(f"{tmp_path} has ")[1].split(" bytes")[0])
    assert abs(free_in_msg - free) < 64 * 2**20  # the folder's real free space
    assert not (tmp_path / "new").exists()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_imagenet", *args], capture_output=True, text=True, timeout=300)


def test_cli_shard_from_zip_and_extract(kaggle, tmp_path):
    p = cli("shard", str(kaggle["nested"]), "--out", str(tmp_path / "z"), "--train-shards", "3", "--val-shards", "2",
            "--no-progress")
    assert p.returncode == 0, p.stderr
    assert "pass 1 of 2" in p.stderr and "pass 2 of 2" in p.stderr
    assert "sharding 24 train + 12 val images of 4 classes into 3 + 2 shards" in p.stderr
    p = cli("extract", str(kaggle["root"]), str(tmp_path / "x"), "--no-progress")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == str(tmp_path / "x")
    p = cli("shard", str(tmp_path / "x"), "--out", str(tmp_path / "z"), "--train-shards", "3", "--val-shards", "2")
    assert p.returncode == 0 and "already holds this dataset" in p.stderr, p.stderr  # same id as from the zip
    z = _valid_zip_with(tmp_path, "slip", {"../evil.txt": b"gotcha"})
    p = cli("extract", str(z), str(tmp_path / "dest"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "spark-imagenet: error:" in p.stderr and "../evil.txt: a '..' component" in p.stderr
    assert not (tmp_path / "dest").exists()


def test_both_zip_forms_straight_to_a_bucket(kaggle, gcs_bucket, tmp_path):
    """`--out gs://...`: the stream form's spill files and shards live in the temp folder, then are uploaded."""
    from spark_imagenet.storage import open_storage

    ref = build(kaggle["tree"], tmp_path / "dir")
    for form in ("root", "nested"):
        url = f"gs://{gcs_bucket}/{form}"
        m = build(kaggle[form], url)
        assert m.dataset_id == ref.dataset_id and m.splits == ref.splits, form
        assert sorted(o.name for o in open_storage(url).list()) == sorted(
            ["manifest.json"] + [s.name for sp in m.splits.values() for s in sp.shards])
