"""The driver program ``spark-submit`` runs: ``spark-imagenet train`` on the session spark-submit made.

Usage (any master; the options and job file are exactly those of ``spark-imagenet train``)::

    spark-submit [spark-submit options] "$(python -m spark_imagenet.submit --path)" URL [train options ...]

``python -m spark_imagenet.submit --path`` prints this file's path in the
installed package (the scripts under ``submit/`` do this). The master and the
Spark settings come from ``spark-submit`` (``--master``, ``--conf``,
``--properties-file``); the job's ``--master`` is refused here, since it would
silently replace spark-submit's, while the job's ``--conf`` settings are added.

Exit status: as ``spark-imagenet`` (0, 2 for a setting or data error, 130 on Ctrl-C).
"""

import os
import sys

# spark-submit runs this file as a script, which puts this package's own folder first on
# sys.path; its subpackages (storage, source, dataset, ...) must not become top-level modules.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)


def main(argv: list[str] | None = None) -> int:
    """Run ``spark-imagenet train ARGV...`` (``--path``: print this file's path instead).

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        int: the exit status of :func:`spark_imagenet.cli.main`.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--path"]:
        print(os.path.abspath(__file__))
        return 0
    from spark_imagenet.cli import main as cli_main

    return cli_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
