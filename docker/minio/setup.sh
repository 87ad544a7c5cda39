#!/bin/sh
# minio-setup (docker/compose.yaml): run once, and again after a change; idempotent.
# Makes the bucket, the policy factory-rw (docker/minio/factory-policy.json: objects of the
# factory bucket only) and the factory's user with that policy. MinIO's root credentials come
# from env/minio.env, the user's from env/s3.env (the same AWS_* the workers use); no secret
# is put on a command line: mc reads the root pair from MC_HOST_local, the user's secret from
# stdin. Rerunning with a new AWS_SECRET_ACCESS_KEY rotates it (user add replaces the secret).
set -eu

: "${MINIO_ROOT_USER:?set in env/minio.env}" "${MINIO_ROOT_PASSWORD:?set in env/minio.env}"
: "${AWS_ACCESS_KEY_ID:?set in env/s3.env}" "${AWS_SECRET_ACCESS_KEY:?set in env/s3.env}"
[ "$AWS_ACCESS_KEY_ID" != "$MINIO_ROOT_USER" ] || { echo "minio-setup: env/s3.env holds MinIO's root user; give the factory its own" >&2; exit 1; }
BUCKET=factory POLICY=factory-rw

# Letters and digits only in the root pair (openssl rand -hex): it is a URL here.
export MC_HOST_local="http://$MINIO_ROOT_USER:$MINIO_ROOT_PASSWORD@minio:9000"
tries=0
until mc ready local >/dev/null 2>&1; do
  tries=$((tries + 1))
  [ "$tries" -lt 60 ] || { echo "minio-setup: MinIO did not come up" >&2; exit 1; }
  sleep 2
done

mc mb --ignore-existing "local/$BUCKET"
mc admin policy create local "$POLICY" /setup/factory-policy.json
printf '%s\n' "$AWS_SECRET_ACCESS_KEY" | mc admin user add local "$AWS_ACCESS_KEY_ID"
if ! out=$(mc admin policy attach local "$POLICY" --user "$AWS_ACCESS_KEY_ID" 2>&1); then
  case "$out" in
    *"already in effect"*) ;;  # attached by an earlier run
    *) echo "$out" >&2; exit 1 ;;
  esac
fi
echo "minio-setup: bucket $BUCKET, user $AWS_ACCESS_KEY_ID with policy $POLICY"
