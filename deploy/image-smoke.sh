#!/usr/bin/env bash
# Smoke-test the image: build it (deploy/build-image.sh), then inside it, as its own user and
# with its own environment, start the entrypoint's `python -m llmsim`, wait for GET /health
# (at most 30 s) and check: not root, LLMSIM_HOST=0.0.0.0, the extras import, /health and a
# chat completion answer. Runs the image with buildah (chroot: no OCI runtime or daemon
# needed), else docker or podman.
#   deploy/image-smoke.sh [TAG] [EXTRAS]        (PYTHON=... as for build-image.sh)
# Needs the python:3.12-slim base (Docker Hub or a mirror of it): not run by CI.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-llmsim:smoke}"
deploy/build-image.sh "$tag" "${@:2}" >&2 || { echo "image-smoke: build failed" >&2; exit 1; }
check='
import json, os, subprocess, sys, time, urllib.request
assert os.getuid() != 0, "runs as root"
assert os.environ["LLMSIM_HOST"] == "0.0.0.0", os.environ.get("LLMSIM_HOST")
for extra in filter(None, sys.argv[1].split(",")):
    __import__({"fast": "uvloop", "tokens": "tiktoken"}.get(extra, extra))
port = "18080"
p = subprocess.Popen([sys.executable, "-m", "llmsim", "--latency", "instant", "--port", port])
base = "http://127.0.0.1:" + port
try:
    for _ in range(60):
        try:
            health = urllib.request.urlopen(base + "/health", timeout=2).read()
            break
        except OSError:
            time.sleep(0.5)
    else:
        raise SystemExit("/health did not answer within 30 s")
    req = urllib.request.Request(base + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"content-type": "application/json"})
    chat = json.loads(urllib.request.urlopen(req, timeout=5).read())
    assert chat["object"] == "chat.completion", chat
    print("image-smoke: ok:", health.decode(), "uid", os.getuid(), "extras", sys.argv[1] or "-")
finally:
    p.terminate()
    p.wait(10)
'
extras="${2-redis}"
if command -v buildah >/dev/null; then
  ctr="$(buildah from "$tag")"
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  buildah run --isolation chroot "$ctr" -- python -c "$check" "$extras"
  exit 0
fi
for tool in docker podman; do
  if command -v "$tool" >/dev/null && { [ "$tool" != docker ] || docker info >/dev/null 2>&1; }; then
    exec "$tool" run --rm --entrypoint python "$tag" -c "$check" "$extras"
  fi
done
echo "image-smoke: needs buildah, docker or podman to run the image" >&2
exit 2
