"""Readable numbers for messages (spark_imagenet.units)."""

from spark_imagenet.units import human_size


def test_human_sizes():
    assert [human_size(n) for n in (0, 1, 999, 1000, 1500, 999_499, 999_600, 2_400_000, 55_379, 155 * 10**9,
                                     2**45)] == [
        "0 bytes", "1 byte", "999 bytes", "1.00 KB", "1.50 KB", "999 KB", "1.00 MB", "2.40 MB", "55.4 KB",
        "155 GB", "35.2 TB"]
