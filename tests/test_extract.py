"""Unpacking the Kaggle zip (spark_imagenet.source.extract): both forms, refusals before anything is
written, free space, interrupted and repeated extracts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from archive_util import (  # noqa: F401
    DATA,
    build,
    cli,
    decoded,
    kaggle,
    same_tree,
    tar_gz_of,
    tree_files,
    valid_zip_with,
    zip_nested_form,
    zip_root_form,
    zip_with_links,
)
from data_util import small_layout
from spark_imagenet.errors import ArchiveError, ConfigError, LayoutError
from spark_imagenet.source.extract import SPACE_MARGIN, extract
from spark_imagenet.source.extract_dest import WRITTEN_LIST
from spark_imagenet.source.layout import EXTRACT_MARKER
from spark_imagenet.source.zip_archive import TAR_MEMBER
from spark_imagenet.units import human_size


def test_extract_both_forms_gives_the_tree_shard_reads(log_lines, kaggle, tmp_path):
    ref = build(kaggle["tree"], tmp_path / "ref")
    root = extract(kaggle["root"], tmp_path / "a", progress=False)
    assert root == tmp_path / "a"
    same_tree(kaggle["tree"], root)
    nested = extract(kaggle["nested"], tmp_path / "b", progress=False)
    assert nested == tmp_path / "b" and not (nested / TAR_MEMBER).exists()
    same_tree(kaggle["tree"], nested)
    top = extract(kaggle["top"], tmp_path / "c", progress=False)
    assert top == tmp_path / "c" / "imagenet-object-localization-challenge"
    same_tree(kaggle["tree"], top)
    top = extract(kaggle["nested-top"], tmp_path / "d", progress=False)
    assert top == tmp_path / "d" / "top"
    same_tree(kaggle["tree"], top)
    assert not any(p.name.endswith(".spark-imagenet-partial") for p in (tmp_path / "b").rglob("*"))
    m = build(nested, tmp_path / "from-extracted")
    assert m.dataset_id == ref.dataset_id and m.splits == ref.splits
    # A rerun keeps what is there (same sizes) and writes nothing.
    before = {p: p.stat().st_mtime_ns for p in tree_files(nested)}
    msgs = log_lines
    msgs.clear()  # the lines from here on
    extract(kaggle["nested"], tmp_path / "b", progress=False)
    assert {p: p.stat().st_mtime_ns for p in tree_files(nested)} == before
    assert "0 bytes written" in msgs[-1]


@pytest.mark.parametrize("member, reason", [
    ("../evil.txt", "a '..' component"),
    ("ILSVRC/../../evil.txt", "a '..' component"),
    ("/tmp/spark-imagenet-zip-slip-test.txt", "an absolute path"),
])
def test_extract_refuses_zip_slip(tmp_path, member, reason):
    z = valid_zip_with(tmp_path, "slip", {member: b"gotcha"})
    dest = tmp_path / "dest" / "inner"
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    assert f"{member}: {reason}" in msg and "nothing was written" in msg and str(dest) in msg
    assert not (tmp_path / "dest").exists()  # nothing inside DEST, not even DEST
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/spark-imagenet-zip-slip-test.txt").exists()


def test_extract_refuses_every_zip_link(tmp_path):
    # Each link alone stays inside DEST, but a/b/c is written through a/b (-> DEST) as DEST/c -> .., outside.
    z = zip_with_links(tmp_path, "chain", {"a/b": "..", "a/b/c": ".."})
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match=r"refused to extract 2 member\(s\); nothing was written:\n  a/b: a "
                       r"symbolic link to \.\.: the link target has a '\.\.' component\n  a/b/c: a symbolic link"):
        extract(z, dest, progress=False)
    assert not dest.exists() and not os.path.lexists(tmp_path / "c")
    z = zip_with_links(tmp_path, "links", {"a/b": "..", "a/b/c": "..", "ILSVRC/escape": "../../../etc",
                                            "ILSVRC/cls-loc": "Data/CLS-LOC", "ILSVRC/abs": "/etc/passwd"})
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    assert f"{z}: refused to extract 5 member(s); nothing was written:" in msg
    for line in ("a/b: a symbolic link to ..: the link target has a '..' component",
                 "a/b/c: a symbolic link to ..: the link target has a '..' component",
                 "ILSVRC/escape: a symbolic link to ../../../etc: the link target has a '..' component",
                 "ILSVRC/cls-loc: a symbolic link to Data/CLS-LOC",  # inside, refused all the same
                 "ILSVRC/abs: a symbolic link to /etc/passwd: the link target is an absolute path"):
        assert f"\n  {line}" in msg, line
    assert "The Kaggle archive holds no symbolic or hard links" in msg
    assert not dest.exists() and not (tmp_path / "c").exists()
    # shard refuses the same zip: it holds links, which the Kaggle archive never does.
    with pytest.raises(ArchiveError, match=r"holds 5 link member\(s\) .*the Kaggle archive has none"):
        build(z, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_extract_refuses_tar_slip_in_the_nested_form(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    evil = tarfile.TarInfo("ILSVRC/../../evil.txt")
    evil.size = 6
    up = tarfile.TarInfo("../up.txt")
    up.size = 6
    sym = tarfile.TarInfo("ILSVRC/etc")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc"
    hard = tarfile.TarInfo("ILSVRC/passwd")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    fifo = tarfile.TarInfo("ILSVRC/pipe")
    fifo.type = tarfile.FIFOTYPE
    # A chain: each link looks safe alone, and the hard link's target is reached through them.
    chain = [tarfile.TarInfo(n) for n in ("ILSVRC/a/b", "ILSVRC/a/b/c", "ILSVRC/h")]
    chain[0].type, chain[0].linkname = tarfile.SYMTYPE, ".."
    chain[1].type, chain[1].linkname = tarfile.SYMTYPE, "../.."
    chain[2].type, chain[2].linkname = tarfile.LNKTYPE, "ILSVRC/a/b/c/x"
    # The chain alone (which looks safe member by member) is refused too.
    z = zip_nested_form(tree, tmp_path / "chain.zip", tar_bytes=tar_gz_of(tree, extra=[(c, b"") for c in chain]))
    with pytest.raises(ArchiveError, match=r"refused to extract 3 member\(s\); nothing was written"):
        extract(z, tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()
    extra = [(evil, b"gotcha"), (up, b"gotcha"), (sym, b""), (hard, b""), (fifo, b"")] + [(c, b"") for c in chain]
    z = zip_nested_form(tree, tmp_path / "slip.zip", tar_bytes=tar_gz_of(tree, extra=extra))
    with pytest.raises(ArchiveError) as e:
        extract(z, tmp_path / "dest", progress=False)
    msg = str(e.value)
    assert f"member {TAR_MEMBER}: refused to extract 8 member(s); nothing was written" in msg and "tar-slip" in msg
    assert "ILSVRC/../../evil.txt: a '..' component" in msg and "../up.txt: a '..' component" in msg
    assert "ILSVRC/etc: a symbolic link to /etc: the link target is an absolute path" in msg
    assert "ILSVRC/passwd: a hard link to /etc/passwd: the link target is an absolute path" in msg
    assert "ILSVRC/pipe: a device, FIFO or other special file" in msg
    assert "ILSVRC/a/b: a symbolic link to .." in msg and "ILSVRC/a/b/c: a symbolic link to ../.." in msg
    assert "ILSVRC/h: a hard link to ILSVRC/a/b/c/x" in msg
    assert "The Kaggle archive holds no symbolic or hard links" in msg
    assert not (tmp_path / "dest").exists() and not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "up.txt").exists()


def _zip_declaring(tmp_path: Path, size: int) -> tuple[Path, Path]:
    """A real zip whose central directory declares a member of ``size`` bytes (the data written is 1 byte)."""
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    z = zip_root_form(tree, tmp_path / "huge.zip")
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr("ILSVRC/Data/CLS-LOC/test/huge.JPEG", b"x")
        zf.filelist[-1].file_size = size
    assert z.stat().st_size < 1_000_000
    return z, tree


def _numbers(msg: str) -> dict[str, int]:
    m = re.search(r"it needs \S+ \S+ \((\d+) bytes: \S+ \S+ in (\d+) file\(s\), one (\d+)-byte block for each of "
                  r"the (\d+) files and folders, and \S+ \S+ to spare\), (.+) has \S+ \S+ \((\d+) bytes\) free; it "
                  r"creates (\d+) files and folders, and the file system has (\d+) free inodes", msg)
    assert m, msg
    keys = ("need", "files", "block", "entries", "folder", "free", "creates", "inodes")
    return {k: (v if k == "folder" else int(v)) for k, v in zip(keys, m.groups())}


def test_extract_checks_free_space_first(tmp_path):
    z, tree = _zip_declaring(tmp_path, 2**45)  # 32 TiB
    dest = tmp_path / "new" / "dest"
    with pytest.raises(ConfigError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    st = os.statvfs(tmp_path)
    data = 2**45 + sum(p.stat().st_size for p in tree_files(tree))
    files = len(tree_files(tree)) + 1
    with zipfile.ZipFile(z) as zf:
        folders = {n.rsplit("/", i)[0] for n in zf.namelist() for i in range(1, n.count("/") + 1)}
    need = data + (files + len(folders)) * st.f_frsize + SPACE_MARGIN  # a block per file and folder, a margin
    assert f"not enough free space to extract {z}: it needs {human_size(need)} ({need} bytes: " in msg
    n = _numbers(msg)
    assert n["files"] == files and n["entries"] == n["creates"] == files + len(folders)
    assert n["block"] == st.f_frsize and n["need"] == data + n["entries"] * st.f_frsize + SPACE_MARGIN
    assert n["folder"] == str(tmp_path) and abs(n["free"] - st.f_bavail * st.f_frsize) < 64 * 2**20
    assert abs(n["inodes"] - st.f_favail) < 10_000  # the file system's free inodes, reported beside the bytes
    assert "35.2 TB" in msg
    assert not (tmp_path / "new").exists()


def test_extract_counts_a_block_per_file_and_a_margin(tmp_path):
    # The files' bytes alone fit (by about 32 MiB), but not with a block per file and the margin.
    tree = small_layout(tmp_path / "probe", num_classes=2, train_per_class=1, val_per_class=1)
    others = sum(p.stat().st_size for p in tree_files(tree))
    st = os.statvfs(tmp_path)
    z, _ = _zip_declaring(tmp_path, st.f_bavail * st.f_frsize - others - SPACE_MARGIN // 2)
    with pytest.raises(ConfigError, match=r"not enough free space to extract .*one \d+-byte block for each"):
        extract(z, tmp_path / "dest", progress=False)
    assert not (tmp_path / "dest").exists()


def test_extract_refuses_a_member_shorter_than_its_declared_size(tmp_path):
    z, _ = _zip_declaring(tmp_path, 5000)
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match=r"huge.JPEG: 1 bytes read where the archive declares 5000"):
        extract(z, dest, progress=False)
    assert not (dest / "ILSVRC/Data/CLS-LOC/test/huge.JPEG").exists()
    assert (dest / EXTRACT_MARKER).exists()  # the extract stopped midway: shard refuses the folder
    with pytest.raises(LayoutError, match=rf"{dest} is an incomplete extract.* Rerun `spark-imagenet extract {z} "
                       rf"{dest}` to finish it"):
        build(dest, tmp_path / "out")


def test_extract_refuses_duplicate_members(tmp_path):
    tree = small_layout(tmp_path / "kaggle", num_classes=2, train_per_class=1, val_per_class=1)
    z = zip_root_form(tree, tmp_path / "dup.zip")
    with zipfile.ZipFile(z, "a") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("LOC_synset_mapping.txt", b"n90000000 other\n")  # a second copy, written last
        zf.writestr("ILSVRC/Data/CLS-LOC/val", b"a file named like a folder")
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    assert f"{z}: refused to extract 2 member(s); nothing was written" in msg
    assert "\n  LOC_synset_mapping.txt: given twice (as a file, then as a file): which copy is meant?" in msg
    assert "\n  ILSVRC/Data/CLS-LOC/val: a file, and also the folder of other members" in msg
    assert not dest.exists()


def test_refusals_say_what_is_wrong_with_each_kind_of_name(tmp_path):
    # A file and a folder of the same name, and a file named "ILSVRC/.": no "given twice", no "shard refuses it".
    z = valid_zip_with(tmp_path, "kinds", {"ILSVRC/Data/CLS-LOC/test/fd": b"file\n",
                                            "ILSVRC/Data/CLS-LOC/test/fd/inner.txt": b"inner\n",
                                            "ILSVRC/.": b"dot\n"})
    with pytest.raises(ArchiveError) as e:
        extract(z, tmp_path / "dest", progress=False)
    msg = str(e.value)
    assert ("\n  ILSVRC/.: a file member whose name ends in '/.', so it names the folder ILSVRC/, not a file" in msg)
    assert ("\n  ILSVRC/Data/CLS-LOC/test/fd: a file, and also the folder of other members (such as "
            "ILSVRC/Data/CLS-LOC/test/fd/inner.txt)") in msg
    assert "A name cannot be a file and a folder at once." in msg
    assert "given twice" not in msg and "shard" not in msg
    # A name given twice: only an image member given twice is refused by shard too, so only then is it said.
    with pytest.warns(UserWarning, match="Duplicate name"):
        image = valid_zip_with(tmp_path, "dup-image", {"ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_00000001.JPEG": b"x"})
    other = valid_zip_with(tmp_path, "dup-other", {"ILSVRC/Data/CLS-LOC/test/n.txt": b"1",
                                                    "ILSVRC/Data/CLS-LOC//test/n.txt": b"2"})
    for z, shard_too in ((image, True), (other, False)):
        with pytest.raises(ArchiveError, match="given twice") as e:
            extract(z, tmp_path / "dest", progress=False)
        assert ("spark-imagenet shard refuses an image member given twice too" in str(e.value)) == shard_too
    with pytest.raises(ArchiveError, match="image member"):
        build(image, tmp_path / "out")
    assert ("ILSVRC/Data/CLS-LOC//test/n.txt: given twice (as a file named ILSVRC/Data/CLS-LOC/test/n.txt, then as "
            "a file): which copy is meant?") in str(e.value)
    assert not (tmp_path / "dest").exists()


def test_names_too_long_for_the_file_system_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    import spark_imagenet.source.extract_members as archive

    long = "ILSVRC/Data/CLS-LOC/test/" + "x" * 300 + ".txt"
    z = valid_zip_with(tmp_path, "long", {long: b"long\n", "ILSVRC/Data/CLS-LOC/test/" + "y" * 256 + "/a.txt": b""})
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    assert "refused to extract 2 member(s); nothing was written" in msg
    assert f"\n  {long}: a name component of 304 bytes; the file system of {dest} allows at most {name_max} " \
           "(NAME_MAX)" in msg
    assert "y" * 256 + "/a.txt: a name component of 256 bytes" in msg
    assert not dest.exists()
    # The whole path under DEST over PATH_MAX (here made small): refused too, the member's length and the limit
    # given, and the fix is a shorter folder (not another download).
    z = valid_zip_with(tmp_path, "path", {})
    with zipfile.ZipFile(z) as zf:
        longest = max(len(n) for n in zf.namelist())
    base = len(str(dest)) + 1
    limit = base + longest + len(".spark-imagenet-partial") + 1  # every member fits, with its temporary name
    k = limit - 5 - base - len("ILSVRC/Data/CLS-LOC/test/")  # fits, but not under its temporary name
    z = valid_zip_with(tmp_path, "path2", {"ILSVRC/Data/CLS-LOC/test/" + "b" * k: b"too long"})
    monkeypatch.setattr(archive, "name_limits", lambda d: (255, limit + 1))
    with pytest.raises(ArchiveError) as e:
        extract(z, dest, progress=False)
    msg = str(e.value)
    full = limit - 5
    assert msg.count("\n  ") == 1 and f"{'b' * k}: {full} bytes as a path under {dest} ({full + 24} under the " \
        f"temporary name it is written under first); the file system allows at most {limit} (PATH_MAX {limit + 1}" \
        in msg
    assert f"choose a folder with a shorter path than {dest}" in msg and "download it again" not in msg
    assert not dest.exists()
    monkeypatch.undo()
    # A name that fits NAME_MAX but not with the temporary suffix is written under a shorter temporary name.
    fits = "ILSVRC/Data/CLS-LOC/test/" + "z" * (name_max - 10)
    z = valid_zip_with(tmp_path, "fits", {fits: b"fits\n"})
    root = extract(z, tmp_path / "fits", progress=False)
    assert (root / fits).read_bytes() == b"fits\n"


def test_a_folder_that_cannot_be_looked_at_is_a_clear_error(kaggle, tmp_path, monkeypatch):
    import errno

    root = _extracted(kaggle, tmp_path / "x")
    blocked = root / "LOC_val_solution.csv"
    real = os.lstat

    def lstat(path, *a, **kw):
        if os.fspath(path) == str(blocked):
            raise OSError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "lstat", lstat)
    with pytest.raises(ConfigError, match=rf"^cannot look at {blocked} \(Permission denied\), where the archive's "
                       r"member LOC_val_solution.csv goes; nothing was written"):
        extract(kaggle["root"], root, progress=False)


_SLOW_EXTRACT = """
import os, sys, time
real = os.replace
def replace(a, b):  # each file takes 50 ms to put in place: the kill lands mid-extract
    time.sleep(0.05)
    real(a, b)
os.replace = replace
from spark_imagenet.source.extract import extract
extract(sys.argv[1], sys.argv[2], progress=False)
"""


def test_a_killed_extract_lists_every_file_it_wrote(log_lines, kaggle, tmp_path):
    from spark_imagenet.source.extract_dest import WrittenList

    dest = tmp_path / "dest"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_EXTRACT, str(kaggle["root"]), str(dest)])

    def written() -> list[Path]:
        return [p for p in tree_files(dest) if not p.name.startswith(".")] if dest.exists() else []

    deadline = time.monotonic() + 60
    while len(written()) < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    files = written()
    assert 8 <= len(files) < len(tree_files(kaggle["tree"])) and (dest / EXTRACT_MARKER).exists()
    names, complete = WrittenList.parse(dest / WRITTEN_LIST)
    assert not complete  # killed while its gzip member was open
    assert {p.relative_to(dest).as_posix() for p in files} <= names  # every file under its final name is listed
    victim = files[-1]
    good = victim.read_bytes()
    victim.write_bytes(bytes(len(good)))  # corrupted, same size
    msgs = log_lines
    msgs.clear()  # the lines from here on
    extract(kaggle["root"], dest, progress=False)  # rewritten, not refused
    assert victim.read_bytes() == good
    same_tree(kaggle["tree"], dest)
    names, complete = WrittenList.parse(dest / WRITTEN_LIST)  # mended, then appended to
    assert complete and names == {p.relative_to(kaggle["tree"]).as_posix() for p in tree_files(kaggle["tree"])}
    assert not (dest / EXTRACT_MARKER).exists()


def _extracted(kaggle, dest: Path) -> Path:
    return extract(kaggle["root"], dest, progress=False)


def test_rerun_compares_crc_and_rewrites_only_its_own_files(log_lines, kaggle, tmp_path):
    root = _extracted(kaggle, tmp_path / "x")
    csv = root / "LOC_val_solution.csv"
    image = root.joinpath(*DATA, "train", "n90000001", "n90000001_2.JPEG")
    good_csv, good_image = csv.read_bytes(), image.read_bytes()
    image.write_bytes(bytes(len(good_image)))  # same size, other bytes: corrupt
    csv.write_bytes(good_csv + b"edited\n")  # another size
    others = [p for p in tree_files(root) if p not in (csv, image) and p.name != WRITTEN_LIST]
    before = {p: p.stat().st_mtime_ns for p in others}
    msgs = log_lines
    msgs.clear()  # the lines from here on
    extract(kaggle["root"], root, progress=False)
    assert image.read_bytes() == good_image and csv.read_bytes() == good_csv  # extract wrote them: rewritten
    assert {p: p.stat().st_mtime_ns for p in others} == before  # the rest is kept, not rewritten
    assert f"{human_size(len(good_csv) + len(good_image))} written in 2 file(s)" in msgs[-1]


def test_rerun_of_the_nested_form_writes_only_what_is_missing_or_wrong(log_lines, kaggle, tmp_path):
    root = extract(kaggle["nested"], tmp_path / "n", progress=False)
    gone = root.joinpath(*DATA, "val", "ILSVRC2012_val_00000002.JPEG")
    bad = root.joinpath(*DATA, "train", "n90000003", "n90000003_1.JPEG")
    gone.unlink()
    bad.write_bytes(b"\xff" * bad.stat().st_size)
    msgs = log_lines
    msgs.clear()  # the lines from here on
    extract(kaggle["nested"], root, progress=False)
    same_tree(kaggle["tree"], root)
    assert "in 2 file(s)" in msgs[-1] and "pass 2 of 2" in " ".join(msgs)


def test_extract_does_not_overwrite_files_it_did_not_write(kaggle, tmp_path):
    dest = tmp_path / "mine"
    mine = dest / "LOC_val_solution.csv"
    mine.parent.mkdir()
    mine.write_text("my own notes\n")
    same = dest / "LOC_synset_mapping.txt"
    same.write_bytes((kaggle["tree"] / "LOC_synset_mapping.txt").read_bytes())  # identical: kept as it is
    image = dest.joinpath(*DATA, "val", "ILSVRC2012_val_00000001.JPEG")
    image.parent.mkdir(parents=True)
    real = kaggle["tree"].joinpath(*DATA, "val", "ILSVRC2012_val_00000001.JPEG").read_bytes()
    image.write_bytes(bytes(len(real)))  # the same size as the member, other bytes
    same_mtime = same.stat().st_mtime_ns
    with pytest.raises(ConfigError) as e:
        extract(kaggle["root"], dest, progress=False)
    msg = str(e.value)
    assert f"{dest} already holds 2 file(s) or folder(s) that differ from {kaggle['root']}'s members" in msg
    assert f"\n  {mine}: 13 bytes where the archive's member has" in msg
    assert f"\n  {image}: same size, other bytes (CRC-32" in msg
    assert "nothing was written" in msg and "--overwrite" in msg
    assert mine.read_text() == "my own notes\n" and sorted(p.name for p in dest.iterdir()) == [
        "ILSVRC", "LOC_synset_mapping.txt", "LOC_val_solution.csv"]
    extract(kaggle["root"], dest, overwrite=True, progress=False)
    assert mine.read_bytes() == (kaggle["tree"] / "LOC_val_solution.csv").read_bytes() and image.read_bytes() == real
    assert same.stat().st_mtime_ns == same_mtime
    same_tree(kaggle["tree"], dest)


def test_interrupted_extract_is_refused_by_shard_until_rerun(log_lines, kaggle, tmp_path):
    # A stored member late in the zip is corrupt: the extract stops there, with most files written.
    z = tmp_path / "late-damage.zip"
    z.write_bytes(kaggle["top"].read_bytes())
    with zipfile.ZipFile(z) as zf:
        info = zf.infolist()[-1]
    data = bytearray(z.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + 5] ^= 0xFF
    z.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    with pytest.raises(ArchiveError, match=rf"{info.filename} cannot be read .*Bad CRC-32"):
        extract(z, dest, progress=False)
    root = dest / "imagenet-object-localization-challenge"
    assert root.joinpath(*DATA, "train").is_dir() and (root / EXTRACT_MARKER).exists()
    for folder in (dest, root):
        with pytest.raises(LayoutError) as e:
            build(folder, tmp_path / "out")
        assert f"{folder} is an incomplete extract: `spark-imagenet extract` was interrupted" in str(e.value)
        assert f"Rerun `spark-imagenet extract {z} {dest}` to finish it" in str(e.value)
    assert not (tmp_path / "out").exists()
    # The rerun (with the zip downloaded again) finishes it; then shard reads it.
    z.write_bytes(kaggle["top"].read_bytes())
    msgs = log_lines
    msgs.clear()  # the lines from here on
    assert extract(z, dest, progress=False) == root
    assert not (dest / EXTRACT_MARKER).exists() and not (root / EXTRACT_MARKER).exists()
    assert "in 1 file(s)" in msgs[-1]
    same_tree(kaggle["tree"], root)
    build(root, tmp_path / "out")


@pytest.mark.slow
def test_ctrl_c_during_extract_says_a_rerun_finishes_it(kaggle, tmp_path):
    z = tmp_path / "big.zip"
    z.write_bytes(kaggle["root"].read_bytes())
    big = "ILSVRC/Data/CLS-LOC/test/zeros.bin"
    with zipfile.ZipFile(z, "a", zipfile.ZIP_DEFLATED) as zf, zf.open(big, "w", force_zip64=True) as f:
        for _ in range(1024):  # 1 GiB of zeros: about 1 MB deflated, seconds to write out
            f.write(bytes(2**20))
    dest = tmp_path / "dest"
    partial = dest / "ILSVRC/Data/CLS-LOC/test/.zeros.bin.spark-imagenet-partial"
    proc = subprocess.Popen([sys.executable, "-m", "spark_imagenet", "extract", str(z), str(dest), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert (f"interrupted: {dest} is incomplete (spark-imagenet shard refuses it); rerun `spark-imagenet extract {z} "
            f"{dest}` to finish it") in err
    assert "Traceback" not in err and err.rstrip().endswith("spark-imagenet: interrupted")
    assert (dest / EXTRACT_MARKER).exists() and not partial.exists()
    with pytest.raises(LayoutError, match="incomplete extract"):
        build(dest, tmp_path / "out")
    extract(z, dest, progress=False)
    assert (dest / big).stat().st_size == 2**30 and not (dest / EXTRACT_MARKER).exists()
    (dest / big).unlink()


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
    z = valid_zip_with(tmp_path, "slip", {"../evil.txt": b"gotcha"})
    p = cli("extract", str(z), str(tmp_path / "dest"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "spark-imagenet: error:" in p.stderr and "../evil.txt: a '..' component" in p.stderr
    assert not (tmp_path / "dest").exists()


