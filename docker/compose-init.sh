#!/usr/bin/env bash
# One-shot set-up of the cluster (the airflow-init service of docker-compose.yaml); safe to run again.
#  - migrates the metadata DB
#  - pools from pools.json, then pool `gpu` sized to GPU_COUNT (one slot per GPU)
#  - connections: eagle3_s3 and aws_default (the S3 store), eagle3_openai (the OpenAI-compatible endpoint)
#  - the simple auth manager's passwords file, so the admin password is the one in .env
set -euo pipefail

: "${GPU_COUNT:?set GPU_COUNT (number of GPUs = slots of pool gpu) in .env}"
: "${S3_ENDPOINT_URL:?set S3_ENDPOINT_URL}"
: "${S3_ACCESS_KEY:?set S3_ACCESS_KEY}"
: "${S3_SECRET_KEY:?set S3_SECRET_KEY}"
REPO=${EAGLE3_REPO:-/opt/eagle3}

airflow db migrate

airflow pools import "$REPO/pools.json"
airflow pools set gpu "$GPU_COUNT" "one slot per GPU; extraction shards and training run here"

# One import with --overwrite (a re-run picks up changed settings); the JSON is built in Python for quoting.
connections_file=$(mktemp --suffix=.json)
trap 'rm -f "$connections_file"' EXIT
python - "$connections_file" <<'PY'
import json, os, sys
s3 = {"conn_type": "aws", "login": os.environ["S3_ACCESS_KEY"], "password": os.environ["S3_SECRET_KEY"],
      "extra": json.dumps({"endpoint_url": os.environ["S3_ENDPOINT_URL"],
                           "region_name": os.environ.get("S3_REGION", "us-east-1")})}
conns = {
    "eagle3_s3": s3,        # what the eagle3 operators read
    "aws_default": s3,      # what the amazon provider's hooks read
    "eagle3_openai": {"conn_type": "http", "host": os.environ.get("OPENAI_BASE_URL", "http://sglang:30000/v1"),
                      "password": os.environ.get("OPENAI_API_KEY", "none")},
}
with open(sys.argv[1], "w") as f:
    json.dump(conns, f)
PY
airflow connections import --overwrite "$connections_file"

# The simple auth manager reads user passwords from this JSON file (shared volume, read by the api-server).
if [[ -n "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-}" ]]; then
  mkdir -p "$(dirname "$AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")"
  python - <<'PY'
import json, os
users = [u.split(":")[0] for u in os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin").split(",") if u]
password = os.environ["AIRFLOW_ADMIN_PASSWORD"]
with open(os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"], "w") as f:
    json.dump({u: password for u in users}, f)
PY
fi
echo "airflow-init: done (pool gpu = $GPU_COUNT slots)"
