"""The driver program ``spark-submit`` runs: ``spark-imagenet train`` on the session spark-submit made.

Usage (any master; the options and job file are exactly those of ``spark-imagenet train``)::

    spark-submit [spark-submit options] "$(python -m spark_imagenet.submit --path)" URL [train options ...]

``python -m spark_imagenet.submit --path`` prints this file's path in the
installed package (the scripts under ``submit/`` do this),
``python -m spark_imagenet.submit --quiet-java-options`` the driver JVM options of the quiet log4j2
configuration that ``spark-imagenet train`` uses (for ``spark-submit --driver-java-options``), and
``python -m spark_imagenet.submit --gpu-discovery-script`` the path of the GPU
discovery script the package ships, for
``spark.executor.resource.gpu.discoveryScript`` (see
:func:`spark_imagenet.resources.gpu_discovery_script`); ``--help`` lists
these three before the options of ``spark-imagenet train``. The master and the
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


#: What ``--help`` prints before the help of ``spark-imagenet train``.
_OWN_OPTIONS = """\
python -m spark_imagenet.submit --path
    print the path of this driver program, for spark-submit
python -m spark_imagenet.submit --gpu-discovery-script
    print the path of the GPU discovery script spark-imagenet ships (executable), for
    spark.executor.resource.gpu.discoveryScript (on a cluster the same path must exist on every worker host)
python -m spark_imagenet.submit --quiet-java-options
    print the driver JVM options of spark-imagenet's quiet log4j2 configuration, for
    spark-submit --driver-java-options (Spark's warnings and errors only, as spark-imagenet train prints)
spark-submit [spark-submit options] "$(python -m spark_imagenet.submit --path)" URL [train options ...]
    train: the options are those of spark-imagenet train, below
"""


def main(argv: list[str] | None = None) -> int:
    """Run ``spark-imagenet train ARGV...``, or print one of the package's paths or the quiet Java options.

    ``--path`` prints this file's path; ``--quiet-java-options`` the quiet
    logging's driver JVM options; ``--gpu-discovery-script`` the
    installed GPU discovery script's; ``--help`` (or ``-h``) names these
    three before the help of ``spark-imagenet train``.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        int: the exit status of :func:`spark_imagenet.cli.main`; for the
        three printing options 0, or 2 (with ``spark-imagenet: error: ...`` on stderr) when
        the script is missing from the installation.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--path"]:
        print(os.path.abspath(__file__))
        return 0
    if argv == ["--quiet-java-options"]:
        from spark_imagenet.training.driver.spark_session import quiet_java_options

        print(quiet_java_options())
        return 0
    if argv == ["--gpu-discovery-script"]:
        from spark_imagenet.errors import EnvironmentSetupError
        from spark_imagenet.resources import gpu_discovery_script

        try:
            print(gpu_discovery_script())
        except EnvironmentSetupError as e:
            print(f"spark-imagenet: error: {e}", file=sys.stderr)
            return 2
        return 0
    if "-h" in argv or "--help" in argv:
        print(_OWN_OPTIONS)
    from spark_imagenet.cli import main as cli_main

    return cli_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
