#!/usr/bin/env bash
# A real harness end to end against llmsim's legacy completions: NVIDIA aiperf (PyPI), offline.
#   bench/harness_aiperf.sh [CONCURRENCY] [REQUESTS]
# Installs aiperf into bench/.peers/aiperf (once), serves aiperf's builtin tokenizer files from
# the bpe-openai package (no network), starts llmsim with a fixed TTFT of 50 ms and a 10 ms
# inter-token gap, runs `aiperf profile --endpoint-type completions --streaming` with
# ignore_eos (fixed 50-token answers), and prints aiperf's TTFT / ITL / length table: they
# must read ~50 ms, ~10 ms and 50 tokens. (2026-11-24, 2-core box: TTFT avg 53.1 ms, ITL avg
# 10.02 ms, 50 tokens, 40/40 requests, 0 errors.)
set -euo pipefail
cd "$(dirname "$0")/.."
conc="${1:-4}"; count="${2:-40}"
venv=bench/.peers/aiperf
[ -x "$venv/bin/aiperf" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q aiperf; }
py="${PYTHON:-python}"  # the Python that has llmsim installed (activate its venv)
cache=$(mktemp -d)
"$py" - "$cache" <<'PY'
import gzip, hashlib, os, sys
from llmsim.sim.tokens import _URL, _bpe_openai_data_dir
d = _bpe_openai_data_dir()
for name in ("o200k_base", "cl100k_base"):
    data = gzip.decompress(open(os.path.join(d, name + ".tiktoken.gz"), "rb").read())
    open(os.path.join(sys.argv[1], hashlib.sha1(_URL.format(name).encode()).hexdigest()), "wb").write(data)
PY
port=18611
"$py" -m llmsim --port "$port" --ttft-ms 50 --itl-ms 10 --max-tokens-mode exact --quiet &
srv=$!
trap 'kill $srv 2>/dev/null; rm -rf "$cache"' EXIT
sleep 2
TIKTOKEN_CACHE_DIR="$cache" "$venv/bin/aiperf" profile --model gpt-4o --tokenizer builtin \
  --url "http://127.0.0.1:$port" --endpoint-type completions --streaming \
  --request-count "$count" --concurrency "$conc" --synthetic-input-tokens-mean 100 \
  --output-tokens-mean 50 --output-tokens-stddev 0 --extra-inputs ignore_eos:true \
  --artifact-dir "$(mktemp -d)" --ui-type none 2>&1 \
  | grep -E "Time to First Token|Inter Token Latency|Output Sequence Length|Request Count|errors="
