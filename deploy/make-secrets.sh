#!/bin/sh
# Makes what docker-compose.yml needs and never holds itself, each only if it is missing:
#   .env                        POSTGRES_PASSWORD, REDIS_PASSWORD, MINIO_ROOT_USER/PASSWORD, HERMES_CODEC_TOKEN
#   deploy/secrets/encryption-keys, deploy/secrets/command-keys   "<id> <base64>" key rings
# Random values from the kernel (python3's secrets module); nothing is printed.
# Rotate a key ring by putting a new line first and keeping the old ones (README).
set -eu
cd "$(dirname "$0")/.."
umask 077
mkdir -p deploy/secrets
rand() { python3 -c 'import secrets; print(secrets.token_urlsafe(32))'; }
key() { python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'; }
id=$(date -u +%Y-%m)
for ring in encryption-keys command-keys; do
  if [ ! -e "deploy/secrets/$ring" ]; then
    printf '%s %s\n' "$id" "$(key)" > "deploy/secrets/$ring"
    # Readable by the image's user (uid 10001) inside the container; the folder (0700)
    # keeps other users of this machine out.
    chmod 0644 "deploy/secrets/$ring"
    echo "made deploy/secrets/$ring"
  fi
done
if [ ! -e .env ]; then
  sed -e "s|^POSTGRES_PASSWORD=.*|POSTGRES_PASSWORD=$(rand)|" \
      -e "s|^REDIS_PASSWORD=.*|REDIS_PASSWORD=$(rand)|" \
      -e "s|^MINIO_ROOT_PASSWORD=.*|MINIO_ROOT_PASSWORD=$(rand)|" \
      -e "s|^HERMES_CODEC_TOKEN=.*|HERMES_CODEC_TOKEN=$(rand)|" deploy/env.example > .env
  echo "made .env (from deploy/env.example)"
fi
