#!/usr/bin/env bash
# Build the llmsim image with whatever OCI builder is installed (docker, buildah or podman).
#   deploy/build-image.sh [TAG] [EXTRAS]     e.g. deploy/build-image.sh llmsim:dev fast,redis
# EXTRAS defaults to the Dockerfile's (redis); pass "" for the runtime dependencies only.
# PYTHON=3.13-slim in the environment picks another python:<tag> base (default 3.12-slim).
# The base image comes from Docker Hub: where Docker Hub is not reachable, configure a
# registry mirror for docker.io in the builder (registries.conf / daemon.json).
# buildah and podman build in docker format (OCI images drop HEALTHCHECK) with chroot
# isolation (works inside an unprivileged container; ISOLATION=oci to change it).
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llmsim:latest}"
args=()
if [ -n "${PYTHON:-}" ]; then
  args+=(--build-arg "PYTHON=$PYTHON")
fi
if [ $# -ge 2 ]; then
  args+=(--build-arg "EXTRAS=$2")
fi
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exec docker build "${args[@]}" -t "$tag" .
fi
for tool in buildah podman; do
  if command -v "$tool" >/dev/null; then
    [ "$tool" = buildah ] && sub=bud || sub=build
    exec "$tool" "$sub" --format docker --isolation "${ISOLATION:-chroot}" "${args[@]}" \
      -t "$tag" .
  fi
done
echo "no OCI image builder found (docker, buildah or podman)" >&2
exit 1
