#!/usr/bin/env bash
# spark-submit the training job in local mode: MASTER (default local[4]) runs every barrier task on this machine.
#   submit/local.sh URL [spark-imagenet train options ...]
#   MASTER='local[8]' submit/local.sh /data/imagenet-shards --workers 8 --epochs 90
# Everything after URL goes to the job unchanged; SPARK_SUBMIT_OPTS_EXTRA adds spark-submit options.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/_common.sh"
need_url "$@"
MASTER="${MASTER:-local[4]}"
job_workers "$MASTER" "$@" >/dev/null
# The driver JVM logs as quietly as `spark-imagenet train` (Spark's warnings and errors; its whole log to a file),
# unless SPARK_SUBMIT_OPTS_EXTRA gives --driver-java-options of its own (given later, it wins).
quiet=()
java_options="$(PYTHONSAFEPATH=1 "$PYTHON_EXE" -m spark_imagenet.submit --quiet-java-options)"
if [ -n "$java_options" ]; then
    quiet=(--driver-java-options "$java_options")
fi
# Every JVM of Spark 4 prints "WARNING: Using incubator modules: jdk.incubator.vector" (Spark's launcher adds the
# module; no JVM option silences the warning): that one line is left out of stderr, as spark-imagenet train does
# (spark_imagenet/training/driver/gateway.py). The filter ignores Ctrl-C, so the job's last lines still get through.
# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "$MASTER" --properties-file "$here/../conf/spark-defaults.conf" ${quiet[@]+"${quiet[@]}"} \
    --conf "spark.pyspark.python=$PYSPARK_PYTHON" ${SPARK_SUBMIT_OPTS_EXTRA:-} "$DRIVER" "$@" \
    2> >(trap '' INT; exec grep -v --line-buffered '^WARNING: Using incubator modules: ' >&2)
