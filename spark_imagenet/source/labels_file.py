"""A labels file as an image source: a CSV, JSON Lines or Parquet table of image paths (or URLs) and labels.

Columns (their names are options): ``path`` (or ``url`` when there is no ``path`` column), ``label``,
and an optional ``split`` (``train``, ``val`` or ``validation``; without it each class is split with the
seeded ``--val-fraction``, :func:`spark_imagenet.source.labelled.split_by_fraction`)::

    path,label,split
    cats/001.jpg,cat,train
    s3://bucket/dogs/002.png,dog,val

* A relative path is resolved against the labels file's folder (a local folder, or the folder URL of a
  labels file in a store); an absolute path or ``file://`` URL is a local file; a URL into any store
  :func:`spark_imagenet.storage.open_storage` serves (``gs://``, ``s3://``, ``abfs://``, ``az://``,
  ``hdfs://``, ``webhdfs://``) is read through a picklable :class:`~spark_imagenet.storage.Storage`
  handle, so the shard builder's worker processes read the images themselves (:class:`StoreReader`).
* Labels are class names (strings: ids in sorted-name order) or class ids (integers, kept as they are:
  they must be 0..K-1 with every id used).
* The file is read with pyarrow (the format from its name: ``.csv``, ``.tsv``, ``.jsonl``, ``.ndjson``,
  ``.json``, ``.parquet``, ``.pq``). Every image named must exist: the sizes come from one listing per
  store (:meth:`Storage.list` under the images' common folder) and ``os.stat`` for local files.

Every problem is found before any shard is written and named with the file and its line (CSV: the
header is line 1; JSON Lines: line = row) or row (Parquet, from 1).
"""

from __future__ import annotations

import dataclasses
import io
import os
import posixpath
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

from spark_imagenet.errors import ConfigError, LayoutError, SparkImagenetError
from spark_imagenet.source.base import ImageFile, ImageReader, ImageSource, SourceDataset
from spark_imagenet.source.labelled import (
    MAX_LISTED, Entry, Selection, check_val_fraction, integer_classes, labelled_dataset, listing, name_classes)
from spark_imagenet.storage import Storage, open_storage

#: The manifest's ``source.kind`` of a labels file.
KIND = "labels-file"
#: File name ending -> format.
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}
#: The values a split column may hold (any case), and the split each means.
SPLIT_VALUES = {"train": "train", "val": "val", "validation": "val"}


def is_url(text: str) -> bool:
    """Whether ``text`` is a URL with a scheme (not a local path, ``file://`` included: that is local)."""
    scheme = urlparse(text).scheme.lower()
    return len(scheme) > 1 and scheme != "file"


def _local(text: str) -> str:
    """A local path given as a path or a ``file://`` URL, as a path."""
    return unquote(urlparse(text).path) if text.lower().startswith("file://") else text


def _format(location: str) -> str:
    """The format of a labels file, from its name.

    Raises:
        ConfigError: an unknown ending.
    """
    name = urlparse(location).path if is_url(location) else location
    fmt = FORMATS.get(os.path.splitext(name)[1].lower())
    if fmt is None:
        raise ConfigError(f"--labels {location}: cannot tell its format from its name; name it .csv, .tsv, "
                          ".jsonl or .parquet", key="--labels", value=location)
    return fmt


def _read_bytes(location: str) -> bytes:
    """The whole labels file, from a local path or a store URL.

    Raises:
        ConfigError: it cannot be read (why).
    """
    try:
        if is_url(location):
            parent, name = location.rstrip("/").rsplit("/", 1)
            return open_storage(parent).read_bytes(name)
        with open(_local(location), "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"--labels {location}: cannot read it ({e.strerror or e})",
                          key="--labels", value=location) from None
    except SparkImagenetError as e:
        raise ConfigError(f"--labels {location}: cannot read it ({e})", key="--labels", value=location) from None


def read_table(location: str) -> Any:
    """Read a labels file into a ``pyarrow.Table`` (empty CSV cells are nulls; nothing else is).

    Raises:
        ConfigError: it cannot be read, or does not parse as its format (pyarrow's reason).
    """
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq

    fmt = _format(location)
    data = io.BytesIO(_read_bytes(location))
    try:
        if fmt in ("csv", "tsv"):
            return pa_csv.read_csv(data, parse_options=pa_csv.ParseOptions(delimiter="\t" if fmt == "tsv" else ","),
                                   convert_options=pa_csv.ConvertOptions(strings_can_be_null=True, null_values=[""]))
        if fmt == "jsonl":
            return pa_json.read_json(data)
        return pq.read_table(data)
    except (pa.ArrowException, OSError, ValueError) as e:
        hint = (" (a column holds numbers in some rows and strings in others: make each column one type)"
                if "changed from" in str(e) else "")
        raise ConfigError(f"--labels {location}: cannot read it as {fmt.upper()} ({e}){hint}",
                          key="--labels", value=location) from None


@dataclasses.dataclass(frozen=True)
class Columns:
    """The column names of a labels file (``None``: the default, which may be absent where optional).

    Attributes:
        path: the image column (``None``: ``path``, else ``url``).
        label: the label column.
        split: the split column (``None``: ``split`` when there is one).
    """

    path: str | None = None
    label: str = "label"
    split: str | None = None

    def resolve(self, found: Sequence[str], location: str) -> tuple[str, str, str | None]:
        """The path, label and split columns of a table with columns ``found``.

        Raises:
            ConfigError: a needed column is missing (the columns found named, and the option to set).
        """
        def missing(what: str, option: str, column: str | None) -> ConfigError:
            return ConfigError(f"--labels {location}: no {what} column; the columns are {', '.join(found) or '(none)'}. "
                               f"Name the right one with {option}", key=option, value=column)

        path = self.path or next((c for c in ("path", "url") if c in found), None)
        if path is None or path not in found:
            raise missing(f"{self.path!r}" if self.path else "'path' (or 'url')", "--path-column", self.path)
        if self.label not in found:
            raise missing(repr(self.label), "--label-column", self.label)
        if self.split is not None and self.split not in found:
            raise missing(repr(self.split), "--split-column", self.split)
        return path, self.label, self.split or ("split" if "split" in found else None)


def _row_name(fmt: str, i: int) -> str:
    """How messages name row ``i`` (0-based) of a labels file."""
    return {"csv": f"line {i + 2}", "tsv": f"line {i + 2}", "jsonl": f"line {i + 1}"}.get(fmt, f"row {i + 1}")


def _labels(table: Any, column: str, location: str, fmt: str) -> tuple[list[str], tuple]:
    """The class name of every row, and the classes.

    Raises:
        LayoutError: nulls, a type that is neither integers nor strings, or a string column mixing
            integers and names (the rows listed), or integer ids that are not 0..K-1.
    """
    import pyarrow as pa

    where = f"{location} column {column!r}"
    col = table.column(column)
    if pa.types.is_dictionary(col.type):  # a categorical column (pandas' category dtype in Parquet)
        col = col.cast(col.type.value_type)
    values = col.to_pylist()
    nulls = [i for i, v in enumerate(values) if v is None or (isinstance(v, str) and not v.strip())]
    if nulls:
        raise LayoutError(f"{where}: {len(nulls)} row(s) without a label; give every row one or remove it:"
                          + listing([_row_name(fmt, i) for i in nulls]))
    if pa.types.is_integer(col.type):
        return [str(v) for v in values], integer_classes(values, where)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise LayoutError(f"{where}: labels of type {col.type}; they must be class names (strings) or class ids "
                          "(integers 0..K-1)")
    values = [v.strip() for v in values]
    ints = [i for i, v in enumerate(values) if v.lstrip("-").isdigit()]
    if ints and len(ints) < len(values):
        names = [i for i, v in enumerate(values) if not v.lstrip("-").isdigit()]
        raise LayoutError(f"{where}: mixed types: {len(ints)} row(s) hold integers and {len(names)} hold names; "
                          "make the column all class ids (0..K-1) or all class names, e.g."
                          + listing([f"{_row_name(fmt, i)}: {values[i]!r}" for i in (ints[:2] + names[:2])]))
    if ints:
        numbers = [int(v) for v in values]
        return [str(v) for v in numbers], integer_classes(numbers, where)
    return values, name_classes(values)


def _splits(table: Any, column: str | None, location: str, fmt: str) -> list[str | None]:
    """The split of every row (``None`` for all when there is no split column).

    Raises:
        LayoutError: rows whose split is not train/val/validation (listed).
    """
    if column is None:
        return [None] * table.num_rows
    values = [None if v is None else str(v).strip().lower() for v in table.column(column).to_pylist()]
    bad = [i for i, v in enumerate(values) if v not in SPLIT_VALUES]
    if bad:
        raise LayoutError(f"{location} column {column!r}: {len(bad)} row(s) whose split is not train or val; fix "
                          "or remove them (or drop the column to split with --val-fraction):"
                          + listing([f"{_row_name(fmt, i)}: {values[i]!r}" for i in bad]))
    return [SPLIT_VALUES[v] for v in values]


def _base(location: str) -> str:
    """The folder relative paths of a labels file are resolved against: its folder (absolute) or folder URL."""
    if is_url(location):
        return location.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(_local(location)))


def resolve(base: str, text: str) -> str:
    """An image's path or URL as written in the labels file, resolved: a URL stays a URL (``..`` removed),
    a local path becomes absolute (relative ones against ``base``, a folder or folder URL)."""
    if is_url(text):
        u = urlparse(text)
        return f"{u.scheme}://{u.netloc}{posixpath.normpath(u.path) if u.path else ''}"
    text = _local(text)
    if os.path.isabs(text):
        return os.path.normpath(text)
    if is_url(base):
        return resolve("", f"{base}/{text}")
    return os.path.normpath(os.path.join(base, text))


def relative(base: str, path: str) -> str:
    """``path`` relative to ``base`` when it lies under it (``/``-separated), else ``path`` itself."""
    if is_url(path) != is_url(base):
        return path
    if is_url(path):
        return path[len(base) + 1:] if path.startswith(base + "/") else path
    rel = os.path.relpath(path, base)
    return path if rel.startswith("..") else Path(rel).as_posix()


@dataclasses.dataclass(frozen=True)
class StoreReader(ImageReader):
    """Reads images by path: local files directly, URLs through the Storage handle of their store
    (picklable: it holds the handles, which reopen their clients in another process).

    Attributes:
        stores: ``(prefix URL, storage opened there)`` for each store the images are in.
    """

    stores: tuple[tuple[str, Storage], ...] = ()

    def read(self, image: ImageFile) -> bytes:
        if not is_url(image.path):
            with open(image.path, "rb") as f:
                return f.read()
        for prefix, storage in self.stores:
            if image.path.startswith(prefix + "/"):
                return storage.read_bytes(image.path[len(prefix) + 1:])
        raise OSError(f"{image.path}: no store opened for it")

    def where(self, image: ImageFile) -> str:
        return image.path


def _store_prefixes(urls: Sequence[str]) -> dict[tuple[str, str], str]:
    """Per ``(scheme, host)``, the URL of the deepest folder holding all of its images."""
    folders: dict[tuple[str, str], list[str]] = {}
    for url in urls:
        u = urlparse(url)
        folders.setdefault((u.scheme, u.netloc), []).append(posixpath.dirname(u.path) or "/")
    return {key: f"{key[0]}://{key[1]}{posixpath.commonpath(paths).rstrip('/')}" for key, paths in folders.items()}


def _sizes(paths: Sequence[str]) -> tuple[list[int | None], tuple[tuple[str, Storage], ...]]:
    """The size of every file (``None``: it does not exist), and the stores opened for the URLs.

    Raises:
        StorageError: a store cannot be listed (its message names it).
    """
    urls = [p for p in paths if is_url(p)]
    prefixes = _store_prefixes(urls)
    stores = tuple((prefix, open_storage(prefix)) for prefix in prefixes.values())
    listed: dict[str, int] = {}
    for prefix, storage in stores:
        listed.update((f"{prefix}/{o.name}", o.size) for o in storage.list())
    sizes: list[int | None] = []
    for p in paths:
        if is_url(p):
            sizes.append(listed.get(p))
        else:
            try:
                st = os.stat(p)
                sizes.append(st.st_size if os.path.isfile(p) else None)
            except OSError:
                sizes.append(None)
    return sizes, stores


@dataclasses.dataclass(frozen=True)
class LabelsFileSource(ImageSource):
    """A labels file (see the module doc).

    Attributes:
        path: the labels file: an absolute local path, or its URL.
        columns: the column names asked for.
        val_fraction: ``--val-fraction`` for a file without a split column.
        stores: once listed, ``(prefix URL, storage)`` of each store its images are in (what
            :meth:`reader` reads them through).
    """

    path: str
    columns: Columns = Columns()
    val_fraction: float | None = None
    stores: tuple[tuple[str, Storage], ...] = dataclasses.field(default=(), compare=False, repr=False)
    random_access = True

    @classmethod
    def open(cls, location: str | os.PathLike, *, path_column: str | None = None, label_column: str = "label",
             split_column: str | None = None, val_fraction: float | None = None) -> "LabelsFileSource":
        """Name a labels file (read by :meth:`list_images`).

        Args:
            location: a local path, ``file://`` URL, or a store URL (``s3://bucket/labels.csv``).
            path_column: the image column (``--path-column``; default ``path``, else ``url``).
            label_column: the label column (``--label-column``).
            split_column: the split column (``--split-column``; default ``split`` when there is one).
            val_fraction: ``--val-fraction``, for a file without a split column.

        Raises:
            ConfigError: an unknown file ending, or a bad ``val_fraction``.
        """
        check_val_fraction(val_fraction)
        text = os.fspath(location)
        text = text if is_url(text) else os.path.abspath(os.path.expanduser(_local(text)))
        _format(text)
        return cls(text, Columns(path_column, label_column, split_column), val_fraction)

    def list_images(self, *, num_classes: int | None = None, class_list: str | os.PathLike | None = None,
                    per_class: int | None = None, seed: int = 0, progress: bool = False) -> SourceDataset:
        """Read the labels file and list its images (see :meth:`ImageSource.list_images`).

        Raises:
            ConfigError: the file cannot be read or parsed, a column is missing, ``--val-fraction`` with a
                split column, or a bad ``--classes``/``--per-class``/``--class-list``.
            LayoutError: rows without a label, mixed or unusable label types, integer labels that are not
                0..K-1, bad split values, a path twice, or files that do not exist (up to 10 listed, with
                their lines).
            StorageError: a store the images are in cannot be listed.
        """
        fmt = _format(self.path)
        table = read_table(self.path)
        path_col, label_col, split_col = self.columns.resolve(table.column_names, self.path)
        if split_col is not None and self.val_fraction is not None:
            raise ConfigError(f"--val-fraction {self.val_fraction}: {self.path} has a split column ({split_col!r}); "
                              "leave --val-fraction out, or drop the column",
                              key="--val-fraction", value=self.val_fraction)
        if table.num_rows == 0:
            raise LayoutError(f"{self.path}: no rows (no images listed)")
        labels, classes = _labels(table, label_col, self.path, fmt)
        splits = _splits(table, split_col, self.path, fmt)
        base = _base(self.path)
        paths = self._paths(table, path_col, base, fmt)
        sizes, stores = _sizes(paths)
        missing = [f"{_row_name(fmt, i)}: {p} does not exist" for i, (p, s) in enumerate(zip(paths, sizes)) if s is None]
        if missing:
            raise LayoutError(f"{self.path}: {len(missing)} image(s) it names do not exist; fix their paths "
                              f"(relative ones are resolved against {base}) or remove the rows:"
                              + listing(missing))
        entries = [Entry(p, relative(base, p), label, size or 0, split)
                   for p, label, size, split in zip(paths, labels, sizes, splits)]
        sel = Selection(num_classes, class_list, per_class, seed, self.val_fraction)
        return labelled_dataset(dataclasses.replace(self, stores=stores), entries, classes, sel, self.path)

    def _paths(self, table: Any, column: str, base: str, fmt: str) -> list[str]:
        """Every row's image, resolved (:func:`resolve`).

        Raises:
            LayoutError: empty cells, or a file named twice (the rows listed).
        """
        raw = table.column(column).to_pylist()
        empty = [_row_name(fmt, i) for i, v in enumerate(raw) if v is None or not str(v).strip()]
        if empty:
            raise LayoutError(f"{self.path} column {column!r}: {len(empty)} row(s) without a path; give every row "
                              "one or remove it:" + listing(empty))
        paths = [resolve(base, str(v).strip()) for v in raw]
        first: dict[str, int] = {}
        twice: list[str] = []
        for i, p in enumerate(paths):
            if p in first:
                twice.append(f"{_row_name(fmt, i)}: {p} (also {_row_name(fmt, first[p])})")
            first.setdefault(p, i)
        if twice:
            raise LayoutError(f"{self.path}: {len(twice)} row(s) name an image another row names; keep one row "
                              "per image:" + listing(twice, MAX_LISTED))
        return paths

    def relpath(self, image: ImageFile) -> str:
        return relative(_base(self.path), image.path)

    def where(self, image: ImageFile) -> str:
        return image.path

    def describe(self) -> dict[str, Any]:
        """``{"kind": "labels-file", "path": <file or URL>, "columns": {...}}``."""
        return {"kind": KIND, "path": self.path, "columns": dataclasses.asdict(self.columns)}

    def reader(self, images: Sequence[ImageFile]) -> StoreReader:
        return StoreReader(self.stores)
