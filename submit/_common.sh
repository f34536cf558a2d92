# Shared by the submit/*.sh scripts (sourced, not run): find spark-submit and the driver program.
# SPARK_SUBMIT: the spark-submit to use (default: the one on PATH, else the one inside the installed pyspark).
# PYTHON: the Python that has spark-imagenet installed (default: python3 on PATH).

PYTHON="${PYTHON:-python3}"
if ! DRIVER="$("$PYTHON" -m spark_imagenet.submit --path 2>/dev/null)"; then
    echo "$(basename "$0"): spark-imagenet is not installed for $PYTHON (pip install . in a virtualenv, then activate it, or set PYTHON)" >&2
    exit 2
fi
if [ -z "${SPARK_SUBMIT:-}" ]; then
    SPARK_SUBMIT="$(command -v spark-submit || true)"
    if [ -z "$SPARK_SUBMIT" ]; then
        SPARK_SUBMIT="$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')"
    fi
fi
# The Python workers run the same interpreter as the driver (a virtualenv's packages).
PYSPARK_PYTHON="${PYSPARK_PYTHON:-$("$PYTHON" -c 'import sys; print(sys.executable)')}"
export PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PYSPARK_PYTHON}"

need_url() {
    if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
        echo "usage: $(basename "$0") URL [spark-imagenet train options ...]" >&2
        exit 2
    fi
}
