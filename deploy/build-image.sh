#!/usr/bin/env bash
# Build the llmsim image with whatever OCI builder is installed (docker, podman or buildah).
#   deploy/build-image.sh [TAG] [EXTRAS]     e.g. deploy/build-image.sh llmsim:dev fast,redis
# EXTRAS defaults to the Dockerfile's (redis); pass "" for the runtime dependencies only.
# The base image is python:3.12-slim from Docker Hub: where Docker Hub is not reachable,
# configure a registry mirror for docker.io in the builder (registries.conf / daemon.json).
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llmsim:latest}"
args=()
if [ $# -ge 2 ]; then
  args+=(--build-arg "EXTRAS=$2")
fi
for tool in docker podman buildah; do
  if command -v "$tool" >/dev/null && { [ "$tool" != docker ] || docker info >/dev/null 2>&1; }; then
    if [ "$tool" = buildah ]; then
      exec buildah bud "${args[@]}" -t "$tag" .
    fi
    exec "$tool" build "${args[@]}" -t "$tag" .
  fi
done
echo "no OCI image builder found (docker, podman or buildah)" >&2
exit 1
