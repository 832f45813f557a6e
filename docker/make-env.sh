#!/usr/bin/env bash
# Print a .env for docker-compose.yaml with fresh random secrets:  bash docker/make-env.sh 4 > .env
# Argument: the number of GPUs (slots of pool gpu). Keep the file private; every Airflow service reads it.
set -euo pipefail
gpus=${1:-1}
[[ "$gpus" =~ ^[0-9]+$ ]] || { echo "usage: $0 GPU_COUNT (a whole number, got '$gpus')" >&2; exit 2; }
rand() { python3 -c "import secrets; print(secrets.token_hex(32))"; }
cat <<ENV
GPU_COUNT=$gpus
AIRFLOW_JWT_SECRET=$(rand)
AIRFLOW_SECRET_KEY=$(rand)
AIRFLOW_FERNET_KEY=$(python3 -c "import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())")
AIRFLOW_ADMIN_PASSWORD=$(python3 -c "import secrets; print(secrets.token_urlsafe(12))")
POSTGRES_PASSWORD=$(rand)
S3_ACCESS_KEY=eagle3
S3_SECRET_KEY=$(rand)
S3_BUCKET=eagle3
EAGLE3_TRAIN_GPUS=1
ENV
