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
# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "$MASTER" --properties-file "$here/../conf/spark-defaults.conf" \
    --conf "spark.pyspark.python=$PYSPARK_PYTHON" ${SPARK_SUBMIT_OPTS_EXTRA:-} "$DRIVER" "$@"
