"""The dataset manifest: ``manifest.json`` beside the shards.

The manifest is the single source of truth for a sharded dataset: which
classes it holds (0-based global class id, WordNet id, names), which shard
files each split has, how many examples and bytes each holds and its CRC32C
(see :mod:`spark_imagenet.storage` for the encoding). It is written last and
atomically by the shard builder, so a manifest never lists a missing shard.

Format (``format_version`` 1)::

    {
      "format": "spark-imagenet-manifest",
      "format_version": 1,
      "dataset_id": "<hex fingerprint of the inputs and settings>",
      "created": "2026-11-30T10:00:00+00:00",
      "label_base": 0,
      "image_format": "JPEG",
      "image_form": "original" | "resize 256 q90" | "max-side 320 q90",
      "feature_keys": [...],
      "source": {...}, "selection": {...},
      "classes": [{"id": 0, "wnid": "n01440764", "names": ["tench", "Tinca tinca"]}, ...],
      "splits": {
        "train": {"examples": N, "bytes": B, "shards": [
            {"name": "train-00000-of-00008.tfrecord", "examples": n, "bytes": b, "crc32c": "..."}, ...]},
        "val": {...}
      },
      "totals": {"examples": N, "bytes": B, "shards": S}
    }

``image_form`` (how the images are stored: :mod:`spark_imagenet.dataset.image_form`) came later within version
1: a manifest without it reads as ``original``, and readers that predate it ignore it (either form trains and
evaluates alike).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spark_imagenet.dataset.image_form import ORIGINAL, ImageForm
from spark_imagenet.errors import ConfigError, ManifestError, SparkImagenetError
from spark_imagenet.source.synset import SynsetClass
from spark_imagenet.storage import Storage
from spark_imagenet.storage.envelope import Envelope

MANIFEST_NAME = "manifest.json"
FORMAT = "spark-imagenet-manifest"
FORMAT_VERSION = 1
#: The manifest's versioned-JSON form.
ENVELOPE = Envelope(FORMAT, FORMAT_VERSION, "spark-imagenet manifest", error=ManifestError,
                    remedy="rebuild the shards with `spark-imagenet shard`")
#: Class ids are 0-based (as TFDS); the TF reference converters use 1-based
#: ids with 0 = background. We never mix the two: this is recorded in every
#: manifest and checked on load.
LABEL_BASE = 0


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One TFRecord shard file.

    Attributes:
        name: object name relative to the bucket URL.
        examples: number of ``tf.train.Example`` records.
        bytes: file size in bytes.
        crc32c: base64 big-endian CRC32C of the whole file (GCS's form).
    """

    name: str
    examples: int
    bytes: int
    crc32c: str

    def to_json(self) -> dict[str, Any]:
        """``{"name", "examples", "bytes", "crc32c"}``, as stored in the manifest."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """The shards of one split (``train`` or ``val``).

    Attributes:
        shards: the shard files, in shard-index order.
    """

    shards: tuple[ShardInfo, ...]

    @property
    def examples(self) -> int:
        """Total number of examples in the split."""
        return sum(s.examples for s in self.shards)

    @property
    def bytes(self) -> int:
        """Total size of the split's shards in bytes."""
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        """``{"examples", "bytes", "shards": [...]}`` with the split's totals."""
        return {
            "examples": self.examples,
            "bytes": self.bytes,
            "shards": [s.to_json() for s in self.shards],
        }


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A parsed ``manifest.json``.

    Attributes:
        dataset_id: hex fingerprint of the source files and shard settings;
            two builds with equal ids hold the same examples in the same order.
        created: ISO-8601 UTC time of the build.
        classes: the classes, ``classes[i].id == i``.
        splits: ``{"train": SplitInfo, "val": SplitInfo}``.
        source: free-form description of where the images came from.
        selection: the class/per-class/seed selection that was applied.
        feature_keys: the ``tf.train.Example`` feature keys in every record.
        image_form: how the images are stored: as the sources hold them, or scaled
            (:class:`~spark_imagenet.dataset.image_form.ImageForm`).
    """

    dataset_id: str
    created: str
    classes: tuple[SynsetClass, ...]
    splits: dict[str, SplitInfo]
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    selection: dict[str, Any] = dataclasses.field(default_factory=dict)
    feature_keys: tuple[str, ...] = ()
    image_form: ImageForm = ORIGINAL

    @property
    def num_classes(self) -> int:
        """Number of classes (the model's output width)."""
        return len(self.classes)

    def to_json(self) -> dict[str, Any]:
        """The manifest as a JSON-serialisable dict (format of the module doc)."""
        splits = {k: v.to_json() for k, v in self.splits.items()}
        return ENVELOPE.to_json({
            "dataset_id": self.dataset_id,
            "created": self.created,
            "label_base": LABEL_BASE,
            "image_format": "JPEG",
            "image_form": self.image_form.label,
            "feature_keys": list(self.feature_keys),
            "source": self.source,
            "selection": self.selection,
            "classes": [c.to_json() for c in self.classes],
            "splits": splits,
            "totals": {
                "examples": sum(v.examples for v in self.splits.values()),
                "bytes": sum(v.bytes for v in self.splits.values()),
                "shards": sum(len(v.shards) for v in self.splits.values()),
            },
        })

    def dumps(self) -> str:
        """The manifest as indented JSON text."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: Any, where: str = "manifest") -> "Manifest":
        """Parse and validate a manifest dict.

        Args:
            data: the decoded JSON.
            where: name of the file, used in error messages.

        Raises:
            ManifestError: wrong format or version, label base other than 0,
                class ids not 0..K-1, totals that do not add up, or an unknown ``image_form``.
        """
        def bad(msg: str) -> ManifestError:
            return ManifestError(f"{where}: {msg}")

        data = ENVELOPE.from_json(data, where)
        if data.get("label_base") != LABEL_BASE:
            raise bad(f"label_base {data.get('label_base')!r}: only 0-based labels are supported")
        try:
            classes = tuple(
                SynsetClass(int(c["id"]), str(c["wnid"]), tuple(c["names"])) for c in data["classes"]
            )
            splits = {
                name: SplitInfo(
                    tuple(
                        ShardInfo(str(s["name"]), int(s["examples"]), int(s["bytes"]), str(s["crc32c"]))
                        for s in split["shards"]
                    )
                )
                for name, split in data["splits"].items()
            }
            form = ImageForm.parse(str(data.get("image_form", "original")))
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise bad(f"malformed entry ({type(e).__name__}: {e})") from e
        if [c.id for c in classes] != list(range(len(classes))):
            raise bad("class ids must be 0..K-1 in order")
        for name, split in splits.items():
            recorded = data["splits"][name]
            if recorded.get("examples") != split.examples or recorded.get("bytes") != split.bytes:
                raise bad(f"split {name!r}: totals do not match the sum of its shards")
        return cls(
            dataset_id=str(data.get("dataset_id", "")),
            created=str(data.get("created", "")),
            classes=classes,
            splits=splits,
            source=dict(data.get("source", {})),
            selection=dict(data.get("selection", {})),
            feature_keys=tuple(data.get("feature_keys", ())),
            image_form=form,
        )

    @classmethod
    def loads(cls, text: str | bytes, where: str = "manifest") -> "Manifest":
        """Parse manifest JSON text.

        Raises:
            ManifestError: not JSON, or invalid (see :meth:`from_json`).
        """
        return cls.from_json(ENVELOPE.decode(text, where), where)

    @classmethod
    def load(cls, storage: Storage) -> "Manifest":
        """Read ``manifest.json`` from a bucket.

        Args:
            storage: the bucket (see :func:`spark_imagenet.storage.open_storage`).

        Raises:
            ManifestError: no such folder, no manifest there (say how to build
                one), or an invalid one.
        """
        where = f"{storage.url.rstrip('/')}/{MANIFEST_NAME}"
        if not storage.root_exists():
            raise ManifestError(f"the dataset folder {storage.url} does not exist. Give the folder of a sharded "
                                "dataset (built with `spark-imagenet shard SOURCE --out URL`)")
        if not storage.exists(MANIFEST_NAME):
            hint = (f" Give the dataset's folder ({storage.url.rstrip('/')[:-len(MANIFEST_NAME) - 1]}), not its "
                    f"{MANIFEST_NAME}." if storage.url.rstrip("/").endswith("/" + MANIFEST_NAME) else "")
            raise ManifestError(
                f"{where} does not exist: this is not a sharded dataset (or its build was interrupted). "
                f"Build it with `spark-imagenet shard SOURCE --out URL`.{hint}"
            )
        try:
            text = storage.read_bytes(MANIFEST_NAME)
        except SparkImagenetError as e:
            raise ManifestError(str(e) if str(e).startswith(where) else f"{where}: {e}") from e
        return cls.loads(text, where)

    def save(self, storage: Storage) -> None:
        """Write ``manifest.json`` atomically (the last step of a build)."""
        storage.write_bytes(MANIFEST_NAME, self.dumps().encode("utf-8"))
