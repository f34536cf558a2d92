#!/usr/bin/env bash
# Spark GPU discovery script (spark.{driver,executor}.resource.gpu.discoveryScript): prints the GPUs this
# host or container sees as {"name": "gpu", "addresses": ["0", "1", ...]}. The pyspark wheel does not ship
# Spark's examples/src/main/scripts/getGpusResources.sh, so this is ours (the same output, from nvidia-smi).
# In the image from docker/Dockerfile it is /opt/spark-imagenet/conf/gpu-discovery.sh; elsewhere copy it to
# the same path on every worker host (or ship it with --files and point the setting at ./gpu-discovery.sh).
set -euo pipefail
addresses="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | sed -e 's/[^0-9]//g' -e '/^$/d' \
    | sed -e 's/.*/"&"/' | paste -sd, -)" || addresses=""
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
