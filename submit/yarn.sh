#!/usr/bin/env bash
# spark-submit the training job to YARN, shipping this virtualenv to every container as an archive.
#   submit/yarn.sh URL [spark-imagenet train options ...]
#   HADOOP_CONF_DIR=/etc/hadoop/conf submit/yarn.sh gs://b/imagenet --workers 8 --epochs 90
#   DEPLOY_MODE=cluster submit/yarn.sh gs://b/imagenet --workers 8 --results /mnt/shared/results.json
#
# HADOOP_CONF_DIR (or YARN_CONF_DIR): the folder with the cluster's yarn-site.xml and core-site.xml.
# DEPLOY_MODE: client (default: the driver runs here) or cluster (the driver runs in YARN's application
#   master; its output goes to the YARN logs, so write --results where you can read it).
# ENV_ARCHIVE: the packed virtualenv (default build/yarn/spark-imagenet-env.tar.gz in this repository),
#   made with venv-pack from PYTHON's virtualenv when missing or older than any file in it.
# PACK_ONLY=1: pack ENV_ARCHIVE (when missing or older than the virtualenv), print its path, submit nothing.
# PACK=0: ship ENV_ARCHIVE as it is (for example one made by conda-pack), never rebuild it.
#   A URL (hdfs:///apps/spark-imagenet/env.tar.gz, s3a://...) is always shipped as it is: upload the packed
#   archive there once (hdfs dfs -put build/yarn/spark-imagenet-env.tar.gz /apps/spark-imagenet/env.tar.gz).
#   World-readable there (and its folders), it is YARN's PUBLIC resource: each NodeManager unpacks it once
#   and every later job starts from that copy, instead of each job uploading and unpacking its own.
# PYTHON_PREFIX: where the virtualenv's base Python lives on the cluster's hosts, if not where it lives
#   here (venv-pack --python-prefix): venv-pack ships the packages, not the interpreter.
# The virtualenv needs no pyspark of its own where the cluster's spark-submit is on PATH (pip install
#   'spark-imagenet[yarn]'): Spark puts its own pyspark.zip and py4j on the containers' PYTHONPATH. Without
#   one, install 'spark-imagenet[spark,yarn]': its pyspark's spark-submit submits the job.
# Executors: one per worker (--workers, or the job file's workers), one barrier task each.
# Everything after URL goes to the job unchanged; SPARK_SUBMIT_OPTS_EXTRA adds spark-submit options (split on
# spaces: no option value with a space in it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/_common.sh"
ENV_ARCHIVE="${ENV_ARCHIVE:-$here/../build/yarn/spark-imagenet-env.tar.gz}"

# The archive: the virtualenv that runs this script, packed with venv-pack (see the README, "YARN").
pack_env() {
    local venv
    venv="$("$PYTHON" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')"
    if [ -z "$venv" ]; then
        echo "yarn.sh: $PYTHON is not a virtualenv; yarn.sh ships one (python3 -m venv ENV; ENV/bin/pip install" \
             "'spark-imagenet[yarn]', or '[spark,yarn]' where no spark-submit is on PATH), or give a packed" \
             "environment with ENV_ARCHIVE=FILE PACK=0" >&2
        exit 2
    fi
    case "$DRIVER" in
        "$venv"/*) ;;
        *) echo "yarn.sh: spark-imagenet is not installed inside $venv but at $DRIVER (an editable install," \
                "pip install -e?); the archive would lack it: pip install . (not -e) into the virtualenv" >&2
           exit 2 ;;
    esac
    # Stale when a file of the virtualenv is newer, bytecode caches aside: running its Python writes those.
    if [ -f "$ENV_ARCHIVE" ] && [ -z "$(find "$venv" -name __pycache__ -prune -o \( -type f -o -type l \) \
            -newer "$ENV_ARCHIVE" -print -quit)" ]; then
        return 0
    fi
    if ! "$PYTHON" -m venv_pack --version >/dev/null 2>&1; then
        echo "yarn.sh: venv-pack is not installed in $venv (pip install 'spark-imagenet[yarn]', or pip install venv-pack)" >&2
        exit 2
    fi
    mkdir -p "$(dirname "$ENV_ARCHIVE")"
    echo "yarn.sh: packing $venv into $ENV_ARCHIVE (once per change of the virtualenv) ..." >&2
    # Left out: Spark's jars (the cluster's Spark brings its own JVM side) and TensorFlow's C++ headers
    # (only for building custom ops): about 0.9 GB of 2.4 GB; the rest packs into a tar.gz of about 0.7 GB.
    "$PYTHON" -m venv_pack -p "$venv" -o "$ENV_ARCHIVE.partial" --format tar.gz --compress-level 1 --force --quiet \
        --exclude 'lib/python*/site-packages/pyspark/jars/*' \
        --exclude 'lib/python*/site-packages/tensorflow/include/*' \
        ${PYTHON_PREFIX:+--python-prefix "$PYTHON_PREFIX"}
    mv -f "$ENV_ARCHIVE.partial" "$ENV_ARCHIVE"
}
if [ "${PACK_ONLY:-0}" = 1 ]; then  # pack (when stale) and print the archive's path; submit nothing
    pack_env
    echo "$ENV_ARCHIVE"
    exit 0
fi
need_url "$@"
if [ -z "${HADOOP_CONF_DIR:-}${YARN_CONF_DIR:-}" ]; then
    echo "yarn.sh: set HADOOP_CONF_DIR to the folder with the cluster's yarn-site.xml" >&2
    exit 2
fi
yarn_conf="${HADOOP_CONF_DIR:-$YARN_CONF_DIR}"
if [ ! -f "$yarn_conf/yarn-site.xml" ]; then
    echo "yarn.sh: no yarn-site.xml in $yarn_conf (HADOOP_CONF_DIR): point it at the folder with the cluster's" \
         "yarn-site.xml and core-site.xml (often /etc/hadoop/conf on a cluster node)" >&2
    exit 2
fi
DEPLOY_MODE="${DEPLOY_MODE:-client}"
case "$DEPLOY_MODE" in
    client|cluster) ;;
    *) echo "yarn.sh: DEPLOY_MODE must be client or cluster (got '$DEPLOY_MODE')" >&2; exit 2 ;;
esac
if [ "$DEPLOY_MODE" = cluster ]; then
    no_local_job_file ", or use DEPLOY_MODE=client" "$@"
fi
WORKERS="$(job_workers yarn "$@")"
case "$ENV_ARCHIVE" in
    *://*) ;;  # already in the cluster's storage (hdfs://, s3a://, ...): shipped as it is, never packed here
    *) if [ "${PACK:-1}" != 0 ]; then
           pack_env
       elif [ ! -f "$ENV_ARCHIVE" ]; then
           echo "yarn.sh: PACK=0 but ENV_ARCHIVE $ENV_ARCHIVE does not exist" >&2
           exit 2
       fi ;;
esac

# Every container unpacks the archive as ./environment; its Python runs the tasks (and, in cluster mode, the
# driver in the application master). In client mode the driver runs on this machine's PYTHON.
SHIPPED_PYTHON=./environment/bin/python
mode_conf=(--conf "spark.yarn.appMasterEnv.PYSPARK_PYTHON=$SHIPPED_PYTHON")
if [ "$DEPLOY_MODE" = client ]; then
    mode_conf+=(--conf "spark.pyspark.driver.python=$PYSPARK_DRIVER_PYTHON")
else
    mode_conf+=(--conf "spark.yarn.appMasterEnv.PYSPARK_DRIVER_PYTHON=$SHIPPED_PYTHON")
fi
# shellcheck disable=SC2086
"$SPARK_SUBMIT" --master yarn --deploy-mode "$DEPLOY_MODE" \
    --properties-file "$here/../conf/spark-defaults.yarn.conf" \
    --archives "$ENV_ARCHIVE#environment" \
    --conf "spark.executor.instances=$WORKERS" \
    --conf "spark.pyspark.python=$SHIPPED_PYTHON" \
    --conf "spark.executorEnv.PYSPARK_PYTHON=$SHIPPED_PYTHON" \
    "${mode_conf[@]}" \
    ${SPARK_SUBMIT_OPTS_EXTRA:-} "$DRIVER" "$@" || {
    status=$?
    if [ "$DEPLOY_MODE" = cluster ]; then
        echo "yarn.sh: the application failed; in cluster mode the driver's own message is in its log:" \
             "yarn logs -applicationId APPLICATION_ID (the application_... id above), container 01_000001" >&2
    fi
    exit "$status"
}
