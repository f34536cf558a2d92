"""``python -m spark_imagenet`` = the ``spark-imagenet`` command."""

import sys

from .cli import main

sys.exit(main())
