#!/usr/bin/env bash
# spark-submit the training job to Kubernetes, cluster deploy mode: a driver pod and one executor pod per
# barrier task, all from IMAGE (docker/Dockerfile, pushed where the cluster pulls from).
#   MASTER=k8s://https://API:443 IMAGE=registry/spark-imagenet:TAG submit/k8s.sh URL [spark-imagenet train options ...]
#   MASTER=k8s://https://10.0.0.1:443 IMAGE=r.example/spark-imagenet:0.1.0 submit/k8s.sh gs://b/imagenet --workers 8 --epochs 90
# NAMESPACE (default `default`): the namespace of the pods. SERVICE_ACCOUNT (default `spark`): the driver's
# service account, which must be allowed to create, watch and delete pods, services and configmaps there.
# Settings: conf/spark-defaults.k8s.conf; pod templates: conf/k8s-driver-pod-template.yaml and
# conf/k8s-executor-pod-template.yaml (shard cache volume, /dev/shm, one GPU per executor).
# spark.executor.instances is the job's --workers (a barrier stage needs all N executors at once). The driver
# runs in the cluster: a job file (--config) on this machine is refused, give its settings as options.
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

# One executor pod per worker (a barrier stage needs all of them at once): the job's workers, as
# `spark-imagenet train --print-config` resolves them (a bad option is reported here, before spark-submit).
no_local_job_file "" "$@"
workers="$(job_workers "$MASTER" "$@")"

# shellcheck disable=SC2086
exec "$SPARK_SUBMIT" --master "$MASTER" --deploy-mode cluster --name spark-imagenet \
    --properties-file "$conf/spark-defaults.k8s.conf" \
    --conf "spark.kubernetes.container.image=$IMAGE" \
    --conf "spark.kubernetes.namespace=${NAMESPACE:-default}" \
    --conf "spark.kubernetes.authenticate.driver.serviceAccountName=${SERVICE_ACCOUNT:-spark}" \
    --conf "spark.kubernetes.driver.podTemplateFile=$conf/k8s-driver-pod-template.yaml" \
    --conf "spark.kubernetes.executor.podTemplateFile=$conf/k8s-executor-pod-template.yaml" \
    --conf "spark.executor.instances=$workers" ${SPARK_SUBMIT_OPTS_EXTRA:-} "local://$driver_in_image" "$@"
