#!/usr/bin/env bash
# spark-submit the training job to a Spark standalone cluster (one barrier task per executor core slot).
#   MASTER=spark://host:7077 submit/standalone.sh URL [spark-imagenet train options ...]
#   MASTER=spark://10.0.0.1:7077 submit/standalone.sh gs://b/imagenet --workers 8 --epochs 90
# Every worker host needs the same Python with spark-imagenet installed at the same path (PYSPARK_PYTHON),
# and a dataset it can read: a bucket, or a path every host mounts (then add --shared-filesystem).
# Everything after URL goes to the job unchanged; SPARK_SUBMIT_OPTS_EXTRA adds spark-submit options.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/_common.sh"
need_url "$@"
case "${MASTER:-}" in
    spark://*) ;;
    *) echo "standalone.sh: set MASTER to the cluster's spark://HOST:PORT (got '${MASTER:-}')" >&2; exit 2 ;;
esac
job_workers "$MASTER" "$@" >/dev/null
# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "$MASTER" --deploy-mode client \
    --properties-file "$here/../conf/spark-defaults.conf" \
    --conf "spark.pyspark.python=$PYSPARK_PYTHON" --conf "spark.executorEnv.PYSPARK_PYTHON=$PYSPARK_PYTHON" \
    ${SPARK_SUBMIT_OPTS_EXTRA:-} "$DRIVER" "$@"
