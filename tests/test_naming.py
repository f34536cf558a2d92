"""Object names of a dataset (spark_imagenet.dataset.naming)."""

from spark_imagenet.dataset.naming import PARTIAL_RE, SHARD_NAME_RE, partial_name, shard_name


def test_shard_names_carry_the_dataset_id_and_match_the_pattern():
    assert shard_name("train", 3, 1024, "3fa2c1d9ffff") == "train-00003-of-01024-3fa2c1d9.tfrecord"
    assert shard_name("val", 0, 4) == "val-00000-of-00004.tfrecord"  # builds before the id was added
    for name in (shard_name("train", 3, 1024, "3fa2c1d9"), shard_name("val", 0, 4)):
        assert SHARD_NAME_RE.match(name) and not PARTIAL_RE.match(name)
    assert not SHARD_NAME_RE.match("notes.txt") and not SHARD_NAME_RE.match("train-1-of-2.tfrecord")


def test_partial_names_are_hidden_and_recognised_as_leftovers():
    name = shard_name("train", 1, 8, "0123abcd")
    tmp = partial_name(name, "123-abcdef01")
    assert tmp == f".{name}.partial-123-abcdef01" and PARTIAL_RE.match(tmp) and not SHARD_NAME_RE.match(tmp)
