#!/usr/bin/env bash
# The image's entry point. `driver` and `executor` are what Spark on Kubernetes passes to the pods it starts
# (the same protocol as Spark's own kubernetes/dockerfiles/spark/entrypoint.sh, which the pyspark wheel does
# not ship); anything else is run as given: `docker run IMAGE spark-imagenet train ...`, `docker run IMAGE bash`.
set -euo pipefail
case "${1:-}" in
    driver)
        shift
        exec "$SPARK_HOME/bin/spark-submit" \
            --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
            --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
            --deploy-mode client "$@"
        ;;
    executor)
        shift
        # spark.executor.extraJavaOptions and friends arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
        java_opts=()
        while IFS= read -r opt; do java_opts+=("$opt"); done < <(env | grep '^SPARK_JAVA_OPT_' \
            | sort -t_ -k4 -n | sed 's/[^=]*=\(.*\)/\1/')
        exec "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
            -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
            -cp "${SPARK_CLASSPATH:+${SPARK_CLASSPATH}:}${SPARK_HOME}/jars/*" \
            org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
            --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
            --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
            --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
            --podName "${SPARK_EXECUTOR_POD_NAME}"
        ;;
    "")
        exec spark-imagenet --help
        ;;
    *)
        exec "$@"
        ;;
esac
