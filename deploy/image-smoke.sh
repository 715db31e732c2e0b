#!/usr/bin/env bash
# Smoke-test the image: build it (deploy/build-image.sh), run it with docker or podman on a
# free local port, wait for GET /health to answer 200 from outside (at most 60 s) and from
# inside (the HEALTHCHECK's view), check it runs as non-root; the container is removed
# whatever happens.
#   deploy/image-smoke.sh [TAG] [EXTRAS]
# Needs the python:3.12-slim base image (Docker Hub or a mirror of it): not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llmsim:smoke}"
runner=""
for tool in docker podman; do
  if command -v "$tool" >/dev/null && { [ "$tool" != docker ] || docker info >/dev/null 2>&1; }; then runner="$tool"; break; fi
done
if [ -z "$runner" ]; then
  echo "image-smoke: needs docker or podman to run the image" >&2
  exit 2
fi
deploy/build-image.sh "$tag" "${@:2}" >&2 || { echo "image-smoke: build failed" >&2; exit 1; }
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cid="$("$runner" run -d -p "127.0.0.1:$port:8080" "$tag" --latency instant)"
trap '"$runner" rm -f "$cid" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 60); do
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
    "$runner" exec "$cid" python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/health', timeout=2)"
    [ "$("$runner" exec "$cid" id -u)" != 0 ] || { echo "image-smoke: runs as root" >&2; exit 1; }
    echo "image-smoke: $tag answers /health on 127.0.0.1:$port (non-root)"
    exit 0
  fi
  sleep 1
done
echo "image-smoke: /health did not answer within 60 s; logs:" >&2
"$runner" logs "$cid" >&2 || true
exit 1
