#!/usr/bin/env bash
# spark-submit the training job to Kubernetes, cluster deploy mode: a driver pod and one executor pod per
# barrier task, all from IMAGE (docker/Dockerfile, pushed where the cluster pulls from).
#   MASTER=k8s://https://API:443 IMAGE=registry/spark-imagenet:TAG submit/k8s.sh URL [spark-imagenet train options ...]
#   MASTER=k8s://https://10.0.0.1:443 IMAGE=r.example/spark-imagenet:0.1.0 submit/k8s.sh gs://b/imagenet --workers 8 --epochs 90
# NAMESPACE (default `default`): the namespace of the pods. SERVICE_ACCOUNT (default `spark`): the driver's
# service account, which must be allowed to create, watch and delete pods, services and configmaps there.
# Settings: conf/spark-defaults.k8s.conf; pod templates: conf/k8s-driver-pod-template.yaml and
# conf/k8s-executor-pod-template.yaml (shard cache volume, /dev/shm, one GPU per executor).
# spark.executor.instances is the job's `--workers N` (a barrier stage needs all N executors at once); when
# the options do not say it (a job file gives it), add --conf spark.executor.instances=N yourself.
# The driver program is the image's /opt/spark-imagenet/submit.py; the URL must be one the pods can read
# (a bucket). Everything after URL goes to the job unchanged; SPARK_SUBMIT_OPTS_EXTRA adds spark-submit
# options (after this script's, so they win), e.g. --conf spark.kubernetes.submission.waitAppCompletion=false.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/_common.sh"
need_url "$@"
case "${MASTER:-}" in
    k8s://*) ;;
    *) echo "k8s.sh: set MASTER to the cluster's API server, k8s://https://HOST:PORT (got '${MASTER:-}')" >&2; exit 2 ;;
esac
if [ -z "${IMAGE:-}" ]; then
    echo "k8s.sh: set IMAGE to the spark-imagenet image the cluster pulls (docker/Dockerfile), e.g. IMAGE=registry/spark-imagenet:0.1.0" >&2
    exit 2
fi
conf="$(cd "$here/../conf" && pwd)"
# Where docker/Dockerfile puts the driver program inside the image.
driver_in_image=/opt/spark-imagenet/submit.py

# The job's --workers N (or --workers=N; the last one given counts, as for the job itself).
workers=""
previous=""
for arg in "$@"; do
    if [ "$previous" = "--workers" ]; then workers="$arg"; fi
    case "$arg" in --workers=*) workers="${arg#--workers=}" ;; esac
    previous="$arg"
done
instances=()
if [ -n "$workers" ]; then
    case "$workers" in
        *[!0-9]*|0*) echo "k8s.sh: --workers needs a whole number >= 1 (got '$workers')" >&2; exit 2 ;;
    esac
    instances=(--conf "spark.executor.instances=$workers")
fi

# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "$MASTER" --deploy-mode cluster --name spark-imagenet \
    --properties-file "$conf/spark-defaults.k8s.conf" \
    --conf "spark.kubernetes.container.image=$IMAGE" \
    --conf "spark.kubernetes.namespace=${NAMESPACE:-default}" \
    --conf "spark.kubernetes.authenticate.driver.serviceAccountName=${SERVICE_ACCOUNT:-spark}" \
    --conf "spark.kubernetes.driver.podTemplateFile=$conf/k8s-driver-pod-template.yaml" \
    --conf "spark.kubernetes.executor.podTemplateFile=$conf/k8s-executor-pod-template.yaml" \
    "${instances[@]}" ${SPARK_SUBMIT_OPTS_EXTRA:-} "local://$driver_in_image" "$@"
