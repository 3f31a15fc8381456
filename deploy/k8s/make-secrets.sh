#!/bin/sh
# Makes what deploy/k8s's secretGenerator reads, where missing (existing files are kept):
#   base/secrets/token    the replay servers' bearer token (64 hex digits)
#   base/secrets/s3.env   MinIO's root credentials (access-key=mneme, secret-key random)
# Both readable by this user only; deploy/k8s/.gitignore keeps them out of git.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p base/secrets
random() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
if [ ! -s base/secrets/token ]; then random 32 > base/secrets/token; echo "made deploy/k8s/base/secrets/token"; fi
if [ ! -s base/secrets/s3.env ]; then
  printf 'access-key=mneme\nsecret-key=%s\n' "$(random 24)" > base/secrets/s3.env
  echo "made deploy/k8s/base/secrets/s3.env"
fi
