"""``python -m spark_imagenet`` = the ``spark-imagenet`` command."""

import sys

from spark_imagenet.cli import main

sys.exit(main())
