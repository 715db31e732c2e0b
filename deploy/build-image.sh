#!/usr/bin/env bash
# Build the llmsim image with whatever OCI builder is installed (docker, podman or buildah).
#   deploy/build-image.sh [TAG] [EXTRAS]     e.g. deploy/build-image.sh llmsim:dev fast,tokens
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llmsim:latest}"
extras="${2:-}"
for tool in docker podman buildah; do
  if command -v "$tool" >/dev/null; then
    if [ "$tool" = buildah ]; then
      exec buildah bud --build-arg EXTRAS="$extras" -t "$tag" .
    fi
    exec "$tool" build --build-arg EXTRAS="$extras" -t "$tag" .
  fi
done
echo "no OCI image builder found (docker, podman or buildah)" >&2
exit 1
