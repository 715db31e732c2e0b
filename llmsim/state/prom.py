"""Prometheus text exposition (format 0.0.4) of a raw stats snapshot (see ``state/stats.py``).

Two sets of names: ``llmsim_*`` (labels ``endpoint``, ``model``, ``transport``, ``status``,
``kind``, ``reason``) and vLLM-compatible ``vllm:*`` (label ``model_name``) so dashboards and
autoscalers built for vLLM work unchanged. Histograms expose the 1-2.5-5 subset of the fine
buckets, whose cumulative counts are exact.

Label values are escaped as the format requires (backslash, double quote and line feed; every
other character is legal inside the quotes); their number and length are bounded where they
enter the stats (``MAX_KEYS``, ``MAX_LABEL``), so the exposition's size is bounded too.
"""

from __future__ import annotations

from typing import Any

from .stats import BOUNDS, EXPORT_BOUNDS, HISTS, NB

__all__ = ["prometheus_text", "CONTENT_TYPE", "METRICS", "ENGINE_METRICS"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name → (type, help): the documented metric set (README "Observability")
METRICS: dict[str, tuple[str, str]] = {
    "llmsim_uptime_seconds": ("gauge", "Seconds since the server started."),
    "llmsim_requests_total": ("counter", "Requests answered, by endpoint, model, transport "
                              "(http, sse, ws) and status (499: client gone before the answer)."),
    "llmsim_errors_total": ("counter", "Errors by kind: error responses by code/type, "
                            "injected faults, client disconnects."),
    "llmsim_stream_ends_total": ("counter", "Streams ended, by reason (completed, stopped, "
                                 "disconnect, cancelled, error, write_stall)."),
    "llmsim_connections_total": ("counter", "TCP connections accepted."),
    "llmsim_active_connections": ("gauge", "Open TCP connections."),
    "llmsim_active_requests": ("gauge", "HTTP requests in flight."),
    "llmsim_active_streams": ("gauge", "Streams being written (SSE and WebSocket)."),
    "llmsim_active_websockets": ("gauge", "Open WebSocket sessions."),
    "llmsim_running_requests": ("gauge", "Requests generating, by model."),
    "llmsim_model_gauge": ("gauge", "Per-model gauges set by features (e.g. queue_depth), by "
                           "name and model."),
    "llmsim_prompt_tokens_total": ("counter", "Billed prompt (input) tokens."),
    "llmsim_completion_tokens_total": ("counter", "Billed completion (output) tokens, "
                                       "reasoning included."),
    "llmsim_reasoning_tokens_total": ("counter", "Billed reasoning tokens."),
    "llmsim_delivered_tokens_total": ("counter", "Output tokens written to clients, by model "
                                      "(stream tokens at the socket write)."),
    "llmsim_time_to_first_token_seconds": ("histogram", "Request received to first token "
                                           "written to the socket, by model."),
    "llmsim_inter_token_latency_seconds": ("histogram", "Gap between consecutive token "
                                           "writes, by model."),
    "llmsim_e2e_request_latency_seconds": ("histogram", "Request received to last byte "
                                           "written, by model."),
    "vllm:num_requests_running": ("gauge", "Requests generating (vLLM-compatible)."),
    "vllm:num_requests_waiting": ("gauge", "Requests queued by the capacity model "
                                  "(vLLM-compatible)."),
    "vllm:prompt_tokens_total": ("counter", "Prompt tokens processed (vLLM-compatible)."),
    "vllm:generation_tokens_total": ("counter", "Generation tokens delivered "
                                     "(vLLM-compatible)."),
    "vllm:prefix_cache_queries_total": ("counter", "Prompt tokens looked up in the prompt "
                                        "cache (vLLM-compatible: tokens, not requests)."),
    "vllm:prefix_cache_hits_total": ("counter", "Prompt tokens found in the prompt cache "
                                     "(vLLM-compatible)."),
    "llmsim_prompt_cache_written_tokens_total": ("counter", "Prompt tokens written to the "
                                                 "cache by Anthropic cache_control."),
    "vllm:time_to_first_token_seconds": ("histogram", "Time to first token "
                                         "(vLLM-compatible)."),
    "vllm:inter_token_latency_seconds": ("histogram", "Inter-token latency "
                                         "(vLLM-compatible)."),
    "vllm:time_per_output_token_seconds": ("histogram", "Time per output token, same data as "
                                           "inter-token latency (vLLM-compatible)."),
    "vllm:e2e_request_latency_seconds": ("histogram", "End-to-end request latency "
                                         "(vLLM-compatible)."),
}

# --engine: the serving engines' own metrics, vLLM's names, labels (model_name, engine) and
# buckets (vllm/v1/metrics/loggers.py), present when an engine runs; name → (type, help)
ENGINE_METRICS: dict[str, tuple[str, str]] = {
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:num_requests_waiting_by_reason": ("gauge", "Number of requests waiting, by reason "
                                            "(capacity: no free seat or KV blocks)."),
    "vllm:engine_sleep_state": ("gauge", "Engine sleep state (llmsim's engines never "
                                "sleep: awake is 1)."),
    "vllm:lora_requests_info": ("gauge", "Running stats on lora requests (llmsim serves no "
                                "LoRA adapters)."),
    "vllm:num_preemptions_total": ("counter", "Cumulative number of preemption from the engine."),
    "vllm:prompt_tokens_cached_total": ("counter", "Number of cached prompt tokens (prefix-cache "
                                  "hits, whole KV blocks)."),
    "vllm:request_success_total": ("counter", "Count of successfully processed requests."),
    "vllm:admission_rejections_total": ("counter", "Requests refused because the waiting queue "
                                  "was full."),
}
# the engine's histograms: vLLM's name → help (the engine's key is the name after "vllm:")
ENGINE_HISTS: dict[str, str] = {
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "vllm:request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "vllm:request_inference_time_seconds": "Histogram of time spent in RUNNING phase for "
                                           "request.",
    "vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for "
                                         "request.",
    "vllm:request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "vllm:request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds "
                                                  "per request.",
    "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
    "vllm:request_generation_tokens": "Number of generation tokens processed.",
    "vllm:request_max_num_generation_tokens": "Histogram of maximum number of requested "
                                              "generation tokens.",
    "vllm:request_params_n": "Histogram of the n request parameter.",
    "vllm:request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "vllm:request_num_preemptions": "Number of preemptions per request.",
    "vllm:request_prefill_kv_computed_tokens": "Prompt tokens whose KV the engine computed "
                                               "(not read from the prefix cache).",
}
for _n, _h in ENGINE_HISTS.items():
    ENGINE_METRICS[_n] = ("histogram", _h)

_HIST_NAMES = {"ttft": ("llmsim_time_to_first_token_seconds",
                        ("vllm:time_to_first_token_seconds",)),
               "itl": ("llmsim_inter_token_latency_seconds",
                       ("vllm:inter_token_latency_seconds",
                        "vllm:time_per_output_token_seconds")),
               "e2e": ("llmsim_e2e_request_latency_seconds",
                       ("vllm:e2e_request_latency_seconds",))}
_LE = [f"{BOUNDS[i]:g}" for i in EXPORT_BOUNDS]


def _esc(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: tuple[tuple[str, Any], ...]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in pairs) + "}"


def _num(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if v == v and v not in (float("inf"), float("-inf")) else \
            ("NaN" if v != v else ("+Inf" if v > 0 else "-Inf"))
    return str(v)


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def head(self, name: str) -> None:
        typ, help_ = METRICS[name] if name in METRICS else ENGINE_METRICS[name]
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {typ}")

    def sample(self, name: str, labels: tuple[tuple[str, Any], ...], value: Any) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_num(value)}")

    def hist(self, name: str, label: str, per_model: dict[str, list[Any]]) -> None:
        self.head(name)
        for model in sorted(per_model):
            h = per_model[model]
            lab = ((label, model),)
            cum = 0
            j = 0
            for k, i in enumerate(EXPORT_BOUNDS):
                while j <= i:
                    cum += h[j]
                    j += 1
                self.sample(name + "_bucket", lab + (("le", _LE[k]),), cum)
            total = sum(h[:NB])
            self.sample(name + "_bucket", lab + (("le", "+Inf"),), total)
            self.sample(name + "_sum", lab, float(h[NB]))
            self.sample(name + "_count", lab, total)


def prometheus_text(raw: dict[str, Any]) -> str:
    """Render a raw (possibly merged) snapshot as Prometheus text format 0.0.4."""
    o = _Out()
    c = raw["counters"]
    g = raw["gauges"]
    o.head("llmsim_uptime_seconds")
    o.sample("llmsim_uptime_seconds", (), round(raw["time"] - raw["started"], 3))
    o.head("llmsim_requests_total")
    for ep, m, tr, st, n in sorted(raw["requests"], key=lambda r: (r[0], r[1], r[2], r[3])):
        o.sample("llmsim_requests_total", (("endpoint", ep), ("model", m), ("transport", tr),
                                           ("status", st)), n)
    o.head("llmsim_errors_total")
    for kind, n in sorted(raw["errors"].items()):
        o.sample("llmsim_errors_total", (("kind", kind),), n)
    o.head("llmsim_stream_ends_total")
    for reason, n in sorted(raw["stream_ends"].items()):
        o.sample("llmsim_stream_ends_total", (("reason", reason),), n)
    o.head("llmsim_connections_total")
    o.sample("llmsim_connections_total", (), c.get("connections_total", 0))
    for name, key in (("llmsim_active_connections", "connections"),
                      ("llmsim_active_requests", "requests"),
                      ("llmsim_active_streams", "streams"),
                      ("llmsim_active_websockets", "websockets")):
        o.head(name)
        o.sample(name, (), g.get(key, 0))
    running = {k: v for k, v in raw["running"].items()}
    o.head("llmsim_running_requests")
    for m, n in sorted(running.items()):
        o.sample("llmsim_running_requests", (("model", m),), n)
    o.head("llmsim_model_gauge")
    for gname, vals in sorted(raw["model_gauges"].items()):
        for m, n in sorted(vals.items()):
            o.sample("llmsim_model_gauge", (("name", gname), ("model", m)), n)
    for name, key in (("llmsim_prompt_tokens_total", "tokens_in"),
                      ("llmsim_completion_tokens_total", "tokens_out"),
                      ("llmsim_reasoning_tokens_total", "tokens_reasoning")):
        o.head(name)
        o.sample(name, (), c.get(key, 0))
    models = raw["models"]
    o.head("llmsim_delivered_tokens_total")
    for m, (_p, d) in sorted(models.items()):
        o.sample("llmsim_delivered_tokens_total", (("model", m),), d)
    hists = raw["hist"]
    for i, hname in enumerate(HISTS):
        del i
        per_model = {m: hs[hname] for m, hs in hists.items()}
        o.hist(_HIST_NAMES[hname][0], "model", per_model)
    # ---- vLLM-compatible names (model_name label) ----
    waiting = raw["model_gauges"].get("queue_depth", {})
    engines = _engines(raw.get("engines", []))
    served = {m for m, _ in engines}
    names = sorted(set(running) | set(waiting) | set(models) | set(hists))
    # a model an engine serves: the engine's running and waiting, labelled as vLLM's
    o.head("vllm:num_requests_running")
    for m in names:
        if m not in served:
            o.sample("vllm:num_requests_running", (("model_name", m),), running.get(m, 0))
    for (m, rank), e in engines.items():
        o.sample("vllm:num_requests_running", (("model_name", m), ("engine", rank)),
                 e["running"])
    o.head("vllm:num_requests_waiting")
    for m in names:
        if m not in served:
            o.sample("vllm:num_requests_waiting", (("model_name", m),), waiting.get(m, 0))
    for (m, rank), e in engines.items():
        o.sample("vllm:num_requests_waiting", (("model_name", m), ("engine", rank)),
                 e["waiting"])
    # (a served model's token counters and latency histograms are its engines', per rank)
    o.head("vllm:prompt_tokens_total")
    for m in names:
        if m not in served:
            o.sample("vllm:prompt_tokens_total", (("model_name", m),),
                     models.get(m, [0, 0])[0])
    for (m, rank), e in engines.items():
        o.sample("vllm:prompt_tokens_total", (("model_name", m), ("engine", rank)),
                 e["queried_tokens"])
    o.head("vllm:generation_tokens_total")
    for m in names:
        if m not in served:
            o.sample("vllm:generation_tokens_total", (("model_name", m),),
                     models.get(m, [0, 0])[1])
    for (m, rank), e in engines.items():
        o.sample("vllm:generation_tokens_total", (("model_name", m), ("engine", rank)),
                 e["generation_tokens"])
    for name, key, ekey in (
            ("vllm:prefix_cache_queries_total", "prompt_cache_queries", "queried_tokens"),
            ("vllm:prefix_cache_hits_total", "prompt_cache_hits", "cached_tokens"),
            ("llmsim_prompt_cache_written_tokens_total", "prompt_cache_writes", "")):
        o.head(name)
        if engines and ekey:  # the engines' lookups of the prompt cache, labelled as vLLM's
            for (m, rank), e in engines.items():
                o.sample(name, (("model_name", m), ("engine", rank)), e[ekey])
        else:
            o.sample(name, (), c.get(key, 0))
    for hname in HISTS:
        per_model = {m: hs[hname] for m, hs in hists.items() if m not in served}
        for vname in _HIST_NAMES[hname][1]:
            o.hist(vname, "model_name", per_model)
            _engine_hist(o, vname, _ENGINE_LATENCY[hname], engines)
    if engines:
        _engine_metrics(o, engines)
    o.lines.append("")
    return "\n".join(o.lines)


def _engines(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The engines' rows by (model, rank), summed where several workers report one."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for e in rows:
        key = (str(e["model"]), str(e["engine"]))
        dst = out.get(key)
        if dst is None:
            out[key] = {k: (dict(v) if k == "success" else
                            {h: [b, list(c), s] for h, (b, c, s) in v.items()} if k == "hists"
                            else v) for k, v in e.items()}
            continue
        for k, v in e.items():
            if k == "success":
                for r, n in v.items():
                    dst[k][r] = dst[k].get(r, 0) + n
            elif k == "hists":
                for h, (_b, c, s) in v.items():
                    d = dst[k].get(h)
                    if d is not None and len(d[1]) == len(c):
                        d[1] = [x + y for x, y in zip(d[1], c, strict=True)]
                        d[2] += s
            elif k == "kv_cache_usage":
                dst[k] = max(dst[k], v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "engine":
                dst[k] += v
    return out


def _engine_metrics(o: _Out, engines: dict[tuple[str, str], dict[str, Any]]) -> None:
    def labs(m: str, rank: str) -> tuple[tuple[str, Any], ...]:
        return (("model_name", m), ("engine", rank))

    o.head("vllm:kv_cache_usage_perc")
    for (m, r), e in engines.items():
        o.sample("vllm:kv_cache_usage_perc", labs(m, r), float(e["kv_cache_usage"]))
    o.head("vllm:num_requests_waiting_by_reason")
    for (m, r), e in engines.items():
        o.sample("vllm:num_requests_waiting_by_reason", labs(m, r) + (("reason", "capacity"),),
                 e["waiting"])
    o.head("vllm:engine_sleep_state")
    for (m, r), _e in engines.items():
        o.sample("vllm:engine_sleep_state", labs(m, r) + (("sleep_state", "awake"),), 1)
    o.head("vllm:lora_requests_info")
    o.sample("vllm:lora_requests_info", (("max_lora", "0"), ("running_lora_adapters", ""),
                                         ("waiting_lora_adapters", "")), 0)
    for name, key in (("vllm:num_preemptions", "preemptions"),
                      ("vllm:prompt_tokens_cached", "cached_tokens"),
                      ("vllm:admission_rejections", "rejected")):
        o.head(name + "_total")
        for (m, r), e in engines.items():
            o.sample(name + "_total", labs(m, r), e[key])
    o.head("vllm:request_success_total")
    for (m, r), e in engines.items():
        for reason in sorted(set(e["success"]) | {"stop", "length", "abort"}):
            o.sample("vllm:request_success_total",
                     labs(m, r) + (("finished_reason", reason),), e["success"].get(reason, 0))
    for name in ENGINE_HISTS:
        o.head(name)
        _engine_hist(o, name, name.removeprefix("vllm:"), engines)


# the engine's own latency histograms behind the stats-based vLLM names (HISTS → engine key)
_ENGINE_LATENCY = {"ttft": "time_to_first_token_seconds",
                   "itl": "inter_token_latency_seconds",
                   "e2e": "e2e_request_latency_seconds"}


def _engine_hist(o: _Out, name: str, key: str,
                 engines: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The samples of histogram ``name`` (its head written) from each engine's ``key``."""
    for (m, r), e in engines.items():
        labs = (("model_name", m), ("engine", r))
        bounds, counts, total = e["hists"][key]
        cum = 0
        for b, c in zip(bounds, counts, strict=False):
            cum += c
            o.sample(name + "_bucket", labs + (("le", f"{float(b):g}" if b % 1
                                                else f"{float(b):.1f}"),), cum)
        n = sum(counts)
        o.sample(name + "_bucket", labs + (("le", "+Inf"),), n)
        o.sample(name + "_sum", labs, float(total))
        o.sample(name + "_count", labs, n)
