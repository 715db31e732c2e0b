#!/usr/bin/env bash
# `vllm bench serve` end to end against llmsim's simulated serving engine, offline.
#   bench/harness_vllm_bench.sh [CONCURRENCIES] [INPUT_LEN]
# Installs vLLM into bench/.peers/vllm once (VLLM_VENV names another venv that has it),
# trains a small byte-level BPE tokenizer into a temporary directory (the harness needs one,
# and the Hugging Face hub is out of reach), then for each concurrency starts a fresh
# `llmsim --engine llama-3.1-8b-h100` and runs the random dataset with --ignore-eos and
# 128-token answers. It prints the harness's TTFT / TPOT and the server's own prompt length and
# mean TTFT from /metrics. INPUT_LEN is in the toy tokenizer's tokens: 3165 counts about 860 on
# the server. Figures and their reading: docs/engine.md, "With vllm bench serve".
set -euo pipefail
cd "$(dirname "$0")/.."
concs="${1:-1 4 16 64}"; inlen="${2:-3165}"
venv="${VLLM_VENV:-bench/.peers/vllm}"
[ -x "$venv/bin/vllm" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q vllm; }
py="${PYTHON:-python}"  # the Python that has llmsim installed (activate its venv)
tok=$(mktemp -d)
"$venv/bin/python" - "$tok" <<'PY'
import random, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
t = Tokenizer(models.BPE(unk_token="<unk>"))
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
words = ("the quick brown fox jumps over a lazy dog while the model serves tokens "
         "from its batch of requests with a cache").split()
rng = random.Random(0)
t.train_from_iterator([" ".join(rng.choice(words) for _ in range(50)) for _ in range(2000)],
                      trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"],
                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>",
                        eos_token="</s>").save_pretrained(sys.argv[1])
PY
port=18612
srv=
trap '[ -n "$srv" ] && kill $srv 2>/dev/null; rm -rf "$tok"' EXIT
for c in $concs; do
  "$py" -m llmsim --port "$port" --engine llama-3.1-8b-h100 --seed 1 --quiet &
  srv=$!
  sleep 2
  n=$(( c * 4 < 24 ? 24 : c * 4 ))
  echo "== concurrency $c, $n requests"
  "$venv/bin/vllm" bench serve --backend vllm --base-url "http://127.0.0.1:$port" \
    --model llama-3.1-8b --tokenizer "$tok" --dataset-name random \
    --random-input-len "$inlen" --random-output-len 128 --num-prompts "$n" \
    --max-concurrency "$c" --ignore-eos --seed "$c" --disable-tqdm 2>&1 \
    | grep -E "Successful requests|Failed requests|Median TTFT|Median TPOT|Output token throughput"
  "$py" - "$port" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
def total(name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^vllm:{name}{{[^}}]*}} (\S+)$", text, re.M))
n = total("request_prompt_tokens_count") or 1
print(f"server: prompt tokens {total('request_prompt_tokens_sum') / n:.0f} a request, "
      f"TTFT mean {1000 * total('time_to_first_token_seconds_sum') / n:.1f} ms")
PY
  kill $srv; wait $srv 2>/dev/null || true; srv=
done
