# Shared by the submit/*.sh scripts (sourced, not run): find spark-submit and the driver program.
# SPARK_SUBMIT: the spark-submit to use (default: the one on PATH, else the one inside the installed pyspark).
# PYTHON: the Python that has spark-imagenet installed (default: python3 on PATH): `pip install .` where the
#   cluster's own spark-submit is on PATH (its Spark gives the driver and the executors their pyspark), else
#   `pip install '.[spark]'` (pyspark, whose spark-submit is then used).

PYTHON="${PYTHON:-python3}"
if ! PYTHON_EXE="$("$PYTHON" -c 'import sys; print(sys.executable)' 2>/dev/null)"; then
    echo "$(basename "$0"): cannot run PYTHON=$PYTHON (set PYTHON to the Python that has spark-imagenet installed)" >&2
    exit 2
fi
# PYTHONSAFEPATH (Python 3.11+): a checkout in the current folder must not shadow the installed package.
if ! DRIVER="$(PYTHONSAFEPATH=1 "$PYTHON_EXE" -m spark_imagenet.submit --path 2>/dev/null)"; then
    echo "$(basename "$0"): spark-imagenet is not installed for $PYTHON (pip install '.[spark]' in a virtualenv, or" \
         "pip install . where the cluster's spark-submit is on PATH; then activate it, or set PYTHON)" >&2
    exit 2
fi
if [ -z "${SPARK_SUBMIT:-}" ]; then
    SPARK_SUBMIT="$(command -v spark-submit || true)"
    if [ -z "$SPARK_SUBMIT" ]; then
        if ! SPARK_SUBMIT="$("$PYTHON_EXE" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))' 2>/dev/null)"; then
            echo "$(basename "$0"): no spark-submit: none on PATH, and no pyspark for $PYTHON. Put the cluster's" \
                 "spark-submit on PATH (or set SPARK_SUBMIT), or pip install '.[spark]' into that Python" >&2
            exit 2
        fi
    fi
fi
# The Python workers run the same interpreter as the driver (a virtualenv's packages).
PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYTHON_EXE}"
export PYSPARK_PYTHON PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$PYSPARK_PYTHON}"

need_url() {
    if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
        echo "usage: $(basename "$0") URL [spark-imagenet train options ...]" >&2
        exit 2
    fi
}

# job_workers MASTER URL [train options ...]: print the job's worker count (its --workers, or its job file's),
# after the checks that need no cluster: the options themselves, no job --master (spark-submit's decides), and
# a dataset the executors of MASTER can read (a path on this machine's disk needs --shared-filesystem).
job_workers() {
    local master="$1"
    shift
    PYTHONSAFEPATH=1 "$PYTHON_EXE" -m spark_imagenet train --check-for-master "$master" "$@" || exit 2
}

# no_local_job_file HINT URL [train options ...]: in cluster deploy mode the driver runs on a cluster host,
# which cannot read a job file on this machine, so --config is refused there (before spark-submit).
no_local_job_file() {
    local hint="$1" arg
    shift
    for arg in "$@"; do
        case "$arg" in
            --config|--config=*)
                echo "$(basename "$0"): --config: in cluster deploy mode the driver runs on a cluster host, which" \
                     "cannot read this machine's job file. Give its settings as options instead (spark-imagenet" \
                     "train URL --config FILE --print-config lists them)$hint" >&2
                exit 2 ;;
        esac
    done
}
