"""Configuration: frozen dataclasses loaded from defaults < TOML file < ``LLMSIM_*`` env < flags.

Every scalar field of :class:`Config` (and of its section dataclasses) becomes a command-line
flag and an environment variable automatically, so option plumbing is written once: the field's
``metadata["help"]`` is its ``--help`` text. A section field ``capacity.max_seqs`` becomes the
flag ``--capacity-max-seqs``, the env var ``LLMSIM_CAPACITY_MAX_SEQS`` and the TOML key
``max_seqs`` in table ``[capacity]``. Unknown keys anywhere are an error naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__version__ = "0.1.0"  # (the package version: llmsim.__version__)

__all__ = ["__version__", "Config", "ConfigError", "ConfigWarning", "ModelSpec", "ResponsesConfig",
           "load_config", "iter_options", "unknown_env_message"]


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names it."""


class ConfigWarning(UserWarning):
    """A setting was ignored (an unknown ``LLMSIM_*`` environment variable)."""


class _Checked:
    """Validation on construction: ``Config(port=70000)`` in code fails exactly as
    ``--port 70000`` does (the CLI, TOML and environment paths build these same dataclasses,
    so each rule lives once, in the class's ``validate``). Types are checked first, so a
    wrong type is named as such rather than failing inside a range check."""

    def __post_init__(self) -> None:
        _check_types(self)
        validate = getattr(self, "validate", None)
        if validate is not None:
            validate()


def opt(default: Any, help: str, *, flag: bool = True, choices: tuple[Any, ...] | None = None,
        metavar: str | None = None) -> Any:
    """A dataclass field with CLI/env metadata."""
    md = {"help": help, "flag": flag, "choices": choices, "metavar": metavar}
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda: type(default)(default), metadata=md)
    return field(default=default, metadata=md)


@dataclass(frozen=True)
class ModelSpec(_Checked):
    """One model in the registry. Unset fields inherit from the built-in profile or defaults."""

    owned_by: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    reasoning: bool | None = None
    ttft_ms: float | None = None
    ttft_jitter: float | None = None
    itl_ms: float | None = None
    itl_jitter: float | None = None
    reasoning_itl_ms: float | None = None
    prefill_ms_per_1k: float | None = None
    cached_prefill_ms_per_1k: float | None = None
    cache_min_tokens: int | None = None
    verbosity: float | None = None
    encoding: str | None = None
    created: int | None = None
    gen_s: float | None = None  # media models: seconds an image, or per second of audio

    def validate(self) -> None:
        for name in ("ttft_ms", "itl_ms", "reasoning_itl_ms", "prefill_ms_per_1k",
                     "cached_prefill_ms_per_1k", "ttft_jitter", "itl_jitter", "gen_s"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1e7:
                raise ConfigError(f"models.{name}: must be between 0 and 1e7")
        if self.cache_min_tokens is not None and not 0 <= self.cache_min_tokens <= 1 << 30:
            raise ConfigError("models.cache_min_tokens: must be between 0 and 2^30")
        if self.verbosity is not None and not 0.01 <= self.verbosity <= 100:
            raise ConfigError("models.verbosity: must be between 0.01 and 100")


@dataclass(frozen=True)
class WebSocketConfig(_Checked):
    """Responses over WebSocket (``GET /v1/responses`` with ``Upgrade: websocket``)."""

    max_connections: int = opt(4096, "Most concurrent WebSocket connections; one more upgrade "
                               "gets 429 before the upgrade (0 = no limit).", metavar="N")
    max_lanes: int = opt(32, "Distinct named lanes (stream_id) per connection, as the real "
                         "service; one more → websocket_stream_limit_reached.", metavar="N")
    max_active: int = opt(16, "Responses generating at once per connection (across lanes); "
                          "further creates wait in FIFO order.", metavar="N")
    max_queued: int = opt(256, "Waiting response.create events per connection before the server "
                          "stops reading the socket (TCP backpressure).", metavar="N")
    max_message_bytes: int = opt(32 * 1024 * 1024, "Largest client message; a bigger one closes "
                                 "the connection with code 1009.", metavar="BYTES")
    connection_time_limit_s: float = opt(3600.0, "Connection lifetime: then an error event "
                                         "websocket_connection_limit_reached and a close "
                                         "(0 = no limit).", metavar="S")
    close_timeout_s: float = opt(5.0, "After the server sends a close frame, wait this long for "
                                 "the client's close frame before dropping the connection.",
                                 metavar="S")
    max_pending_bytes: int = opt(64 * 1024 * 1024, "Bytes of unfinished client messages (still "
                                 "arriving in fragments) held across all connections; the "
                                 "connection whose fragment would pass it is closed with code "
                                 "1013 (try again later) (0 = no limit).", metavar="BYTES")
    fragment_timeout_s: float = opt(30.0, "A client message must be complete this many seconds "
                                    "after its first fragment arrived, else the connection is "
                                    "closed with code 1008 (0 = no limit).", metavar="S")

    def validate(self) -> None:
        for name in ("max_lanes", "max_active", "max_queued", "max_message_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"websocket.{name}: must be >= 1")
        for name in ("max_connections", "connection_time_limit_s", "close_timeout_s",
                     "max_pending_bytes", "fragment_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"websocket.{name}: must be >= 0")


MIN_BYTE_BOUND = 64 * 1024  # below this a byte budget could not hold one small response


@dataclass(frozen=True)
class ResponsesConfig(_Checked):
    """The Responses API's state: stored responses, conversations, background work."""

    store_max_entries: int = opt(1024, "Most stored responses kept (oldest evicted first); 0 "
                                 "disables storage (store=true then behaves like store=false).",
                                 metavar="N")
    store_ttl_s: float = opt(3600.0, "Seconds a stored response is kept (0 = until evicted by "
                             "the entry cap).", metavar="S")
    shared_store_max_bytes: int = opt(256 * 1024 * 1024, "--workers > 1: most bytes of "
                                      "stored responses in the shared on-disk store (the "
                                      "oldest are evicted first, as for store_max_entries; the "
                                      "newest is always kept); 0 = bounded by "
                                      "store_max_entries only.", metavar="BYTES")
    store_max_bytes: int = opt(256 * 1024 * 1024, "Most bytes held by stored responses, "
                               "estimated (request body, item overhead, output), counting the "
                               "earlier turns a stored chain keeps alive; the oldest are evicted "
                               "first. A response bigger than this alone is answered but not "
                               "stored (background: 400). 0 = no byte bound.", metavar="BYTES")
    max_chain_depth: int = opt(256, "previous_response_id chains: most earlier turns kept as "
                               "context (older turns are forgotten, bounding memory).",
                               metavar="N")
    chain_max_bytes: int = opt(64 * 1024 * 1024, "previous_response_id chains: most bytes of "
                               "earlier turns kept as context (older turns are forgotten, as "
                               "with max_chain_depth; at most store_max_bytes); 0 = no byte "
                               "bound.", metavar="BYTES")
    conversations_max_entries: int = opt(256, "Most conversations kept (oldest evicted first); "
                                         "0 disables /v1/conversations.", metavar="N")
    conversations_max_bytes: int = opt(256 * 1024 * 1024, "Most bytes of items held by all "
                                       "conversations together, estimated (the oldest "
                                       "conversation is evicted first); 0 = no byte bound.",
                                       metavar="BYTES")
    conversation_ttl_s: float = opt(3600.0, "Seconds a conversation is kept (0 = until "
                                    "evicted by the entry cap).", metavar="S")
    conversation_max_items: int = opt(1000, "Most items in one conversation transcript (the "
                                      "oldest items are dropped first).", metavar="N")
    conversation_max_bytes: int = opt(64 * 1024 * 1024, "Most bytes of items in one "
                                      "conversation, estimated (the oldest items are dropped "
                                      "first; at most conversations_max_bytes); a client "
                                      "item bigger than this alone gets 400 request_too_large. "
                                      "0 = no byte bound.", metavar="BYTES")
    background_max_active: int = opt(256, "Most background responses generating at once "
                                     "(429 above).", metavar="N")

    def validate(self) -> None:
        """Reject negative bounds (naming the key)."""
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigError(f"responses.{f.name}: must be >= 0")
        if self.max_chain_depth < 1:
            raise ConfigError("responses.max_chain_depth: must be >= 1")
        for name in ("store_max_bytes", "chain_max_bytes", "conversations_max_bytes",
                     "conversation_max_bytes"):
            if 0 < getattr(self, name) < MIN_BYTE_BOUND:
                raise ConfigError(f"responses.{name}: must be 0 (no byte bound) or at least "
                                  f"{MIN_BYTE_BOUND}")


FAULT_KINDS = ("429", "500", "503", "529", "504", "reset", "hang", "disconnect", "stall",
               "error", "truncate")
"""Fault kinds that can be drawn with a probability (``p_<kind>`` keys; see README)."""


@dataclass(frozen=True)
class FaultRates(_Checked):
    """Per-model or per-endpoint fault probabilities; unset kinds inherit the global value."""

    p_429: float | None = None
    p_500: float | None = None
    p_503: float | None = None
    p_529: float | None = None
    p_504: float | None = None
    p_reset: float | None = None
    p_hang: float | None = None
    p_disconnect: float | None = None
    p_stall: float | None = None
    p_error: float | None = None
    p_truncate: float | None = None

    def validate(self) -> None:
        total = 0.0
        for k in FAULT_KINDS:
            v = getattr(self, "p_" + k)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"faults.p_{k}: must be between 0 and 1")
            total += v or 0.0
        if total > 1.0 + 1e-9:
            raise ConfigError("faults: the p_* probabilities add up to more than 1")


def _prob(kind: str, what: str) -> Any:
    return opt(0.0, f"Probability that a request gets {what}.", metavar="P")


@dataclass(frozen=True)
class FaultsConfig(_Checked):
    """Fault injection: probabilities per kind (section ``[faults]``), header, timings."""

    header: bool = opt(True, "Honour the X-LLMSim-Fault request header (per-request faults).")
    p_429: float = _prob("429", "a 429 rate_limit_exceeded")
    p_500: float = _prob("500", "a 500 server_error")
    p_503: float = _prob("503", "a 503 (engine overloaded)")
    p_529: float = _prob("529", "a 529 overloaded")
    p_504: float = _prob("504", "a 504 gateway timeout")
    p_reset: float = _prob("reset", "its connection reset before any byte")
    p_hang: float = _prob("hang", "a hang of --faults-hang-ms, then --faults-hang-status")
    p_disconnect: float = _prob("disconnect", "its stream dropped after N tokens")
    p_stall: float = _prob("stall", "its stream stalled --faults-stall-ms after N tokens")
    p_error: float = _prob("error", "an error event after N tokens")
    p_truncate: float = _prob("truncate", "its stream cut after N tokens without the terminal "
                           "event")
    after_min: int = opt(0, "Smallest N (tokens before a drawn mid-stream fault).", metavar="N")
    after_max: int = opt(50, "Largest N (tokens before a drawn mid-stream fault).", metavar="N")
    hang_ms: float = opt(30000.0, "How long a drawn 'hang' fault waits.", metavar="MS")
    hang_status: int = opt(0, "What follows a drawn hang: 0 drops the connection, else this "
                           "HTTP status (e.g. 504).", metavar="STATUS")
    stall_ms: float = opt(5000.0, "How long a drawn 'stall' fault pauses the stream.",
                          metavar="MS")
    error_status: int = opt(500, "Status reported by a drawn mid-stream 'error' fault.",
                            metavar="STATUS")
    retry_after_ms: float = opt(1000.0, "retry-after(-ms) sent with injected 429 and 503.",
                                metavar="MS")
    models: Mapping[str, FaultRates] = opt({}, "Per-model probabilities ([faults.models.\"id\"] "
                                           "tables).", flag=False)
    endpoints: Mapping[str, FaultRates] = opt({}, "Per-endpoint probabilities "
                                              "([faults.endpoints.\"chat.completions\"]).",
                                              flag=False)

    def validate(self) -> None:
        FaultRates(**{"p_" + k: getattr(self, "p_" + k) for k in FAULT_KINDS}).validate()
        if not 0 <= self.after_min <= self.after_max:
            raise ConfigError("faults.after_min/after_max: need 0 <= min <= max")
        for name in ("hang_ms", "stall_ms", "retry_after_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"faults.{name}: must be >= 0")
        if self.hang_status and not 400 <= self.hang_status <= 599:
            raise ConfigError("faults.hang_status: 0 or an HTTP error status (400-599)")
        if not 400 <= self.error_status <= 599:
            raise ConfigError("faults.error_status: an HTTP error status (400-599)")


@dataclass(frozen=True)
class Limits(_Checked):
    """Requests and tokens per minute for one model or one API key (unset: inherit)."""

    rpm: int | None = None
    tpm: int | None = None

    def validate(self) -> None:
        for name in ("rpm", "tpm"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"ratelimit.{name}: must be >= 0 (0 = unlimited)")


@dataclass(frozen=True)
class RateLimitConfig(_Checked):
    """Token-bucket rate limits per (API key, model), off while every limit is 0."""

    rpm: int = opt(0, "Requests per minute per API key and model (0 = unlimited).",
                   metavar="N")
    tpm: int = opt(0, "Tokens per minute per API key and model, counted as prompt estimate + "
                   "max output tokens (0 = unlimited).", metavar="N")
    models: Mapping[str, Limits] = opt({}, "Per-model limits ([ratelimit.models.\"id\"]).",
                                       flag=False)
    keys: Mapping[str, Limits] = opt({}, "Per-API-key limits ([ratelimit.keys.\"sk-...\"]), "
                                     "override the model's.", flag=False)

    def validate(self) -> None:
        Limits(self.rpm, self.tpm).validate()

    @property
    def enabled(self) -> bool:
        return bool(self.rpm or self.tpm or any(
            (lim.rpm or lim.tpm) for tab in (self.models, self.keys) for lim in tab.values()))


@dataclass(frozen=True)
class EngineSpec(_Checked):
    """Per-model capacity overrides (unset: inherit the [capacity] values)."""

    max_seqs: int | None = None
    queue: int | None = None
    itl_slope: float | None = None
    prefill_ms_per_1k: float | None = None
    engine: str | None = None  # this model's --engine profile ("" = none)

    def validate(self) -> None:
        _check_engine(self.engine, "capacity.models.*.engine")


MAX_DATA_PARALLEL = 64  # engines per model (--data-parallel)


# the engine profiles by name: sim.engine puts its table here when it loads (config sits
# below the simulation and does not import it); until then, the names in the package data
ENGINE_PROFILES: dict[str, Any] = {}


def _engine_names() -> Collection[str]:
    if ENGINE_PROFILES:
        return ENGINE_PROFILES.keys()
    import json
    from importlib import resources

    raw = json.loads(resources.files("llmsim.data").joinpath("engines.json").read_text())
    return frozenset(raw["profiles"])


def _check_engine(name: str | None, where: str) -> None:
    if name:
        names = _engine_names()
        if name not in names:
            raise ConfigError(f"{where}: unknown engine profile {name!r}; choose one of "
                              f"{', '.join(sorted(names))}")


@dataclass(frozen=True)
class CapacityConfig(_Checked):
    """Capacity per model: the hosted models on the serving scheduler (api/serving.py, an
    engine derived from each model's latency profile), a slot count for what it does not run."""

    max_seqs: int = opt(0, "Concurrent sequences per model (0 = unlimited: capacity model "
                        "off). On: each model runs on a serving-engine scheduler derived from "
                        "its own latency profile (one sequence's step is its ITL, prefill at "
                        "its prefill rate): a request alone is timed as without it, requests "
                        "together share steps (docs/engine.md). Not with --latency instant "
                        "(a slot count only).", metavar="N")
    queue: int = opt(64, "Requests per model that may wait for a free sequence; beyond it they "
                     "are rejected with --capacity-reject-status.", metavar="N")
    itl_slope: float = opt(0.0, "Step cost per sequence in the step, as a fraction of the "
                           "model's ITL, once the step is compute-bound: decode is flat up to "
                           "about 1/X sequences, then grows by X * ITL per sequence.",
                           metavar="X")
    prefill_ms_per_1k: float = opt(0.0, "Extra prefill compute per 1000 prompt tokens, added "
                                   "to the model's prefill rate in the scheduler's steps (so "
                                   "it also slows the streams sharing them).", metavar="MS")
    reject_status: int = opt(429, "Status for requests beyond the queue: 429 or 503.",
                             metavar="STATUS")
    models: Mapping[str, EngineSpec] = opt({}, "Per-model engines ([capacity.models.\"id\"]).",
                                           flag=False)

    def validate(self) -> None:
        if self.max_seqs < 0 or self.queue < 0:
            raise ConfigError("capacity.max_seqs/queue: must be >= 0")
        if self.itl_slope < 0 or self.prefill_ms_per_1k < 0:
            raise ConfigError("capacity.itl_slope/prefill_ms_per_1k: must be >= 0")
        if self.reject_status not in (429, 503):
            raise ConfigError("capacity.reject_status: must be 429 or 503")

    @property
    def enabled(self) -> bool:
        return bool(self.max_seqs or any(e.max_seqs for e in self.models.values()))


@dataclass(frozen=True)
class Config(_Checked):
    """Server configuration. Frozen; build one with :func:`load_config` or directly."""

    # --- network -------------------------------------------------------------------------
    host: str = opt("127.0.0.1", "Address to bind (use 0.0.0.0 to listen on all interfaces).")
    port: int = opt(8080, "TCP port to bind; 0 picks a free port (printed on start).")
    workers: str = opt("1", "Server processes sharing the port (SO_REUSEPORT), supervised and "
                       "restarted by the parent; 'auto' = one per CPU. Stats cover all of "
                       "them; stored responses move to a shared on-disk store.",
                       metavar="N|auto")
    loop: Literal["auto", "asyncio", "uvloop"] = opt(
        "auto", "Event loop: 'auto' uses uvloop when installed (the 'fast' extra), else "
        "asyncio.", choices=("auto", "asyncio", "uvloop"))
    # --- simulation ----------------------------------------------------------------------
    seed: int | None = opt(None, "Seed for reproducible output: the same request gives the same "
                           "text, token counts and delays. Unset: runs vary.", metavar="N")
    latency: Literal["realistic", "instant"] = opt(
        "realistic", "Latency mode: 'realistic' uses each model's TTFT/inter-token profile; "
        "'instant' makes every delay zero (CI, throughput tests).",
        choices=("realistic", "instant"))
    ttft_ms: float | None = opt(None, "Fixed time-to-first-token in ms for every model, no jitter "
                                "(overrides the model profiles).", metavar="MS")
    itl_ms: float | None = opt(None, "Fixed inter-token gap in ms for every model, no jitter "
                               "(overrides the model profiles).", metavar="MS")
    served_model_name: tuple[str, ...] = opt(
        (), "Serve exactly these model ids, as vLLM's --served-model-name does: /v1/models "
        "lists only them (the first one first) and any other id is a 404 model_not_found. A "
        "known id keeps its profile; any other id gets the default chat profile (or, on "
        "/v1/embeddings, the default embedding profile).", metavar="NAME")
    default_model: str = opt("gpt-4o", "The model listed first by GET /v1/models: harnesses "
                             "that benchmark 'the first model' (guidellm, inference-perf) get "
                             "this one (a non-reasoning model by default).", metavar="ID")
    azure_deployments: tuple[str, ...] = opt(
        (), "Azure OpenAI: the model behind a deployment, NAME=MODEL (repeatable; TOML: a "
        "list). A deployment not listed serves the model of its own name.",
        metavar="NAME=MODEL")
    aws_keys: tuple[str, ...] = opt(
        (), "Bedrock: verify SigV4 signatures against these key pairs, ACCESS_KEY_ID:SECRET "
        "(repeatable): a request signed with another key id, or whose signature does not "
        "match, is a 403. Unset: any SigV4 header is accepted unverified. When recording, "
        "Bedrock requests signed with one of these keys are signed again for the upstream's "
        "host.",
        metavar="ID:SECRET")
    strict_models: bool = opt(False, "Reject unknown model ids with 404 model_not_found "
                              "(default: accept any id with the default profile).")
    replay: str | None = opt(None, "Serve the generation endpoints (and Realtime sessions' "
                             "responses) from the cassettes in this "
                             "directory (recorded with `llmsim record`), matched by method, "
                             "path, stream and the normalised body (docs/record-replay.md).",
                             metavar="DIR")
    replay_speed: float = opt(1.0, "Replay streams at the recorded timing divided by X "
                              "(2 = twice as fast, 0 = no delays).", metavar="X")
    record_upstream: str | None = opt(None, "Record (`llmsim record --upstream URL`): proxy "
                                      "the generation endpoints to this http:// or https:// "
                                      "base URL (e.g. https://api.openai.com) and save each "
                                      "exchange to --cassettes (a /v1/realtime WebSocket "
                                      "session: one cassette).", metavar="URL")
    record_route: tuple[str, ...] = opt((), "Record: send one family's requests to its own "
                                        "upstream, NAME=URL with NAME openai, anthropic, "
                                        "gemini, ollama, bedrock or a path prefix such as "
                                        "/v1/embeddings (`llmsim record "
                                        "--upstream anthropic=https://api.anthropic.com`).",
                                        metavar="NAME=URL")
    record_mode: Literal["once", "new_episodes", "none", "all"] | None = opt(
        None, "Record: once (replay when --cassettes already holds cassettes, else record "
        "all), new_episodes (replay what matches, record the rest), none (replay only), all "
        "(always record, overwriting). Default: all with --record-upstream, none with --replay.",
        choices=("once", "new_episodes", "none", "all"))
    record_errors: bool = opt(False, "Record: also save upstream answers with an error status "
                              "(>= 400); by default they are passed to the client, not saved.")
    upstream_ca: str | None = opt(None, "Record: a PEM file of CA certificates trusted for "
                                  "https:// upstreams besides the system store (a private "
                                  "CA).", metavar="FILE")
    upstream_read_timeout_s: float = opt(60.0, "Record: most seconds one read from the "
                                         "upstream may wait (connect included); then 504.",
                                         metavar="S")
    upstream_timeout_s: float = opt(600.0, "Record: most seconds one upstream exchange may "
                                    "take from connect to the last byte; then 504.",
                                    metavar="S")
    record_max_bytes: int = opt(64 * 1024 * 1024, "Record: largest upstream answer saved as "
                                "one cassette; a larger one is a 502 (a stream ends with "
                                "an error event; chunked audio is cut).", metavar="BYTES")
    record_budget_bytes: int = opt(1024 * 1024 * 1024, "Record: most cassette bytes one "
                                   "recording session writes; then 502 (0 = no bound).",
                                   metavar="BYTES")
    match_ignore: tuple[str, ...] = opt((), "Cassette matching: top-level body fields that do "
                                        "not select a cassette, besides user, metadata, "
                                        "safety_identifier, prompt_cache_key and "
                                        "stream_options.", metavar="FIELD")
    cassettes: str | None = opt(None, "Where `llmsim record` reads and writes cassettes "
                                "(default ./cassettes).", metavar="DIR")
    script: str | None = opt(None, "A script of replies (JSON, or TOML by extension): rules "
                             "matching requests, answered turn by turn per session (see README "
                             "'Scripted replies'); POST /llmsim/scripts replaces it at run "
                             "time.", metavar="FILE")
    text: Literal["lorem", "echo", "fixed", "sequence"] = opt(
        "lorem", "Text generator: lorem (sentences of single-token words), echo (repeat the last "
        "user message), fixed (--fixed-text), sequence (1,2,3,...).",
        choices=("lorem", "echo", "fixed", "sequence"))
    fixed_text: str = opt("Hello! This is a simulated response from llmsim.",
                          "The text used by --text fixed.", metavar="TEXT")
    output_tokens_mean: float | None = opt(
        None, "Replace the prompt-aware length model by one log-normal with this mean (tokens) "
        "for every request, whatever it asks (unset: lengths follow what is asked, see "
        "--max-tokens-mode natural).", metavar="N")
    output_tokens_sigma: float = opt(0.5, "Log-normal sigma of --output-tokens-mean "
                                     "(0 = always the mean).", metavar="S")
    output_tokens_min: int = opt(1, "Shortest natural answer (tokens).", metavar="N")
    output_tokens_max: int = opt(4096, "Longest natural answer (tokens); a request's own "
                                 "max_tokens always wins.", metavar="N")
    max_tokens_mode: str = opt(
        "natural", "Where answer lengths come from. 'natural' (default): from what the request "
        "asks (a greeting is short, a 1000-word essay long, a plain chat turn follows the "
        "Azure 2023 conversation trace), cut at exactly max_tokens with finish_reason 'length' "
        "when longer, as a real model is. 'exact': every answer fills its max_tokens "
        "(fixed-length benchmarks; per request: ignore_eos). 'trace:FILE': lengths drawn "
        "from a CSV with ContextTokens,GeneratedTokens columns (the Azure trace format), "
        "from the rows of the nearest input size. ('cap', the retired mode, reads as "
        "'natural'.)", metavar="MODE")
    engine: str = opt(
        "", "Serve every model with a simulated vLLM-like serving engine of this profile "
        "(continuous batching in steps, chunked prefill, KV cache in blocks, preemption, "
        "prefix-cache hits, vLLM's metrics): token timing comes from the engine's steps, "
        "not from per-request latency draws. Profiles: llama-3.1-8b-h100, "
        "llama-3.1-70b-h100-tp4, llama-3-8b-a100-40gb (docs/engine.md). Off by default; "
        "when set, every model has this profile and the --capacity-* options keep only "
        "--capacity-reject-status.", metavar="PROFILE")
    data_parallel: int = opt(
        1, "With --engine: this many engines (data-parallel ranks) per model behind the one "
        "port. A request picks one with the X-data-parallel-rank header (0..N-1, as vLLM), "
        "else goes to the least loaded (waiting x 4 + running, as vLLM's coordinator); "
        "vLLM's metrics carry each rank in their 'engine' label.", metavar="N")
    time_scale: float = opt(
        1.0, "Run the simulation this many times faster than real time (0.001 to 1000): "
        "token timing, the engine's steps, delays, cache TTLs and rate-limit windows all run "
        "on the scaled clock, and reported durations are simulated seconds; connection "
        "timeouts stay real.", metavar="X")
    prompt_cache_bytes: int = opt(
        64 * 1024 * 1024, "Memory for the simulated prompt cache (digests of prompt prefixes, "
        "never their text; least recently used dropped first; 0 = no prompt caching).",
        metavar="BYTES")
    tokenizer: Literal["auto", "estimate"] = opt(
        "auto", "Token counting: 'auto' is exact when the optional tiktoken extra is installed "
        "(its files load in ~0.4 s at start-up, the first request waits for them); 'estimate' "
        "never loads it (documented estimate, fastest start-up). Generated text is exact either "
        "way.", choices=("auto", "estimate"))
    tool_call_probability: float | None = opt(
        None, "Tool policy for tool_choice 'auto'. Unset (default): agent-like — on a user turn "
        "the model calls the tool that best matches the user's words (a few with "
        "parallel_tool_calls), and answers in text once tool results follow. A probability P "
        "(0-1): the old random policy for load tests — a call with probability P on every turn "
        "(P/5 after a tool result).", metavar="P")
    # --- limits and timeouts -------------------------------------------------------------
    max_body_bytes: int = opt(32 * 1024 * 1024, "Largest accepted request body (413 above).",
                              metavar="BYTES")
    max_header_bytes: int = opt(32 * 1024, "Largest accepted request head (431 above).",
                                metavar="BYTES")
    state: str | None = opt(None, "Shared state for several replicas behind a load balancer: "
                            "redis://HOST:PORT/DB (needs the redis extra). Stored responses, "
                            "conversations, background status, rate-limit buckets, fault-rule "
                            "counters and script cursors then live in Redis; if Redis is down, "
                            "requests that need it get a 503 and others keep working. Unset "
                            "(default): in memory (sqlite across --workers on one machine).",
                            metavar="URL")
    max_pipelined: int = opt(32, "Most pipelined requests buffered per connection before the "
                             "server stops reading from it.", metavar="N")
    max_input_items: int = opt(2048, "Most items one request may carry in chat 'messages' or "
                               "Responses 'input' (item references included); more is a 400 "
                               "array_above_max_length (2048: Azure OpenAI's documented limit "
                               "on messages).", metavar="N")
    header_timeout_s: float = opt(10.0, "Close a connection whose request head has not arrived "
                                  "within this many seconds (slowloris guard).", metavar="S")
    idle_timeout_s: float = opt(75.0, "Close an idle keep-alive connection after this many "
                                "seconds.", metavar="S")
    write_stall_timeout_s: float = opt(30.0, "Cut a connection (HTTP or WebSocket) whose "
                                       "client has not drained the server's write buffer "
                                       "for this many seconds (writing stayed paused): its "
                                       "streams and capacity slots are released (0 = never).",
                                       metavar="S")
    shutdown_grace_s: float = opt(10.0, "On SIGINT/SIGTERM, let in-flight requests finish for "
                                  "this many seconds before closing them.", metavar="S")
    journal: int = opt(0, "Keep the last N API requests (method, path, headers without "
                       "credentials, body, answer status) for GET /llmsim/journal (0 = off; "
                       "the pytest plugin turns it on).", metavar="N")
    journal_max_bytes: int = opt(16 * 1024 * 1024, "Most bytes the journal holds (the oldest "
                                 "requests are dropped first; a body is kept up to 64 KiB).",
                                 metavar="BYTES")
    # --- misc ----------------------------------------------------------------------------
    quiet: bool = opt(False, "Do not print the start-up banner.")
    loop_watch_ms: float = opt(0.0, "Measure the event loop's stalls with a tick every MS "
                               "milliseconds: GET /llmsim/loop reports the CPU the loop "
                               "thread spent between ticks and how late they came (0 = off).",
                               metavar="MS")
    log_level: Literal["debug", "info", "warning", "error"] = opt(
        "warning", "Log level of the llmsim loggers; 'info' turns on the access log (one line "
        "per request: method, path, model, status, tokens, TTFT, duration).",
        choices=("debug", "info", "warning", "error"))
    log_format: Literal["plain", "json"] = opt(
        "plain", "Log line format: 'plain' text or 'json' (one object per line).",
        choices=("plain", "json"))
    api_key: tuple[str, ...] = opt((), "Require one of these API keys (Bearer token or api-key "
                                   "header) on /v1 paths; wrong or missing → 401.",
                                   metavar="KEY")
    admin_key: tuple[str, ...] = opt(
        (), "Require one of these keys on changes under /llmsim/ (POST/DELETE: fault rules, "
        "stats reset), sent as 'Authorization: Bearer KEY', an X-LLMSim-Admin-Key header or an "
        "api-key header; wrong or missing → 401. Unset: those changes need one of the --api-key "
        "keys when any is set, else they stay open. Reads (GET stats, metrics, capacity, "
        "faults, dashboard) stay open either way.", metavar="KEY")
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    ratelimit: RateLimitConfig = field(default_factory=RateLimitConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    websocket: WebSocketConfig = field(default_factory=WebSocketConfig)
    models: Mapping[str, ModelSpec] = opt({}, "Extra or overridden models ([models.\"id\"] tables "
                                          "in the config file).", flag=False)

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed (validated like any Config)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        _check(self)


# ------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One flattened scalar option: its dotted path, flag, env var, type and help."""

    path: tuple[str, ...]
    type: Any
    default: Any
    help: str
    choices: tuple[Any, ...] | None
    metavar: str | None

    @property
    def flag(self) -> str:
        return "--" + "-".join(self.path).replace("_", "-")

    @property
    def dest(self) -> str:
        return "__".join(self.path)

    @property
    def env(self) -> str:
        return "LLMSIM_" + "_".join(self.path).upper()


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def iter_options(cls: type = Config, prefix: tuple[str, ...] = ()) -> list[Option]:
    """All scalar options of a config dataclass (recursing into section dataclasses)."""
    out: list[Option] = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if _is_section(tp):
            out.extend(iter_options(tp, prefix + (f.name,)))
            continue
        if not f.metadata.get("flag", False):
            continue
        default = (f.default if f.default is not dataclasses.MISSING
                   else f.default_factory())  # type: ignore[operator]
        out.append(Option(prefix + (f.name,), tp, default, f.metadata.get("help", ""),
                          f.metadata.get("choices"), f.metadata.get("metavar")))
    return out


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def coerce(value: Any, tp: Any, name: str) -> Any:
    """Convert a TOML/env/flag value to the field type, or raise ConfigError naming ``name``."""
    base, optional = _strip_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name}: a value is required")
    if isinstance(value, str) and optional and value.strip().lower() in ("", "none", "null"):
        return None
    origin = typing.get_origin(base)
    try:
        if origin is Literal:
            allowed = typing.get_args(base)
            if value not in allowed:
                raise ConfigError(f"{name}: {value!r} is not one of {', '.join(map(str, allowed))}")
            return value
        if base is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ConfigError(f"{name}: {value!r} is not a boolean (use true/false)")
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ConfigError(f"{name}: {value!r} is not an integer")
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ConfigError(f"{name}: {value!r} is not a number")
            return float(value)
        if base is str:
            if not isinstance(value, str):
                raise ConfigError(f"{name}: {value!r} is not a string")
            return value
        if origin is tuple:
            (item_tp, *_rest) = typing.get_args(base)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)):
                raise ConfigError(f"{name}: expected a list")
            return tuple(coerce(v, item_tp, name) for v in value)
        if origin in (dict, Mapping, typing.Mapping) or base is dict:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name}: expected a table")
            args = typing.get_args(base)
            vt = args[1] if len(args) == 2 else Any
            if _is_section(vt):
                return {str(k): build_section(vt, v, f"{name}.{k}") for k, v in value.items()}
            return dict(value)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: invalid value {value!r} ({exc})") from None
    return value


def build_section(cls: type, data: Any, name: str) -> Any:
    """Build a (possibly nested) config dataclass from a mapping, rejecting unknown keys."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{name}: expected a table")
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, val in data.items():
        k = str(key).replace("-", "_")
        if k not in known:
            where = f"{name}." if name else ""
            raise ConfigError(f"unknown config key '{where}{key}'")
        tp = hints[k]
        full = f"{name}.{k}" if name else k
        kwargs[k] = build_section(tp, val, full) if _is_section(tp) else coerce(val, tp, full)
    try:
        obj = cls(**kwargs)  # validates itself (_Checked.__post_init__)
    except TypeError as exc:
        raise ConfigError(f"{name or 'config'}: {exc}") from None
    return obj


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _merge(dst: dict[str, Any], src: Mapping[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def unknown_env_message(key: str, known: Collection[str]) -> str:
    """The warning for an unknown ``LLMSIM_*`` variable, naming a close known one if any."""
    # compared without the shared prefix, which would make every name look close
    names = {k.removeprefix("LLMSIM_"): k for k in known}
    close = difflib.get_close_matches(key.removeprefix("LLMSIM_"), list(names), n=1,
                                      cutoff=0.75)
    hint = f" (did you mean {names[close[0]]}?)" if close else ""
    return f"unknown environment variable {key} ignored{hint}"


def load_config(file: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None,
                warn: Callable[[str], None] | None = None) -> Config:
    """Build a Config: defaults < TOML ``file`` < ``LLMSIM_*`` in ``env`` < ``overrides``.

    ``overrides`` maps dotted paths (``"port"``, ``"capacity.max_seqs"``) to values. An
    unknown ``LLMSIM_*`` variable is not an error (test suites set names like
    ``LLMSIM_URL`` for their client side): it is reported through ``warn`` (default: a
    :class:`ConfigWarning`), naming a close known variable when it looks like a typo.
    """
    tree: dict[str, Any] = {}
    if file:
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from None
        _merge(tree, data)
    env = os.environ if env is None else env
    options = iter_options()
    known_env = {o.env: o for o in options}
    for key, val in env.items():
        if not key.startswith("LLMSIM_"):
            continue
        if key == "LLMSIM_CONFIG":
            continue
        o = known_env.get(key)
        if o is None:
            msg = unknown_env_message(key, [*known_env, "LLMSIM_CONFIG"])
            if warn is None:
                warnings.warn(msg, ConfigWarning, stacklevel=2)
            else:
                warn(msg)
            continue
        _set_path(tree, o.path, coerce(val, o.type, key))
    for dotted, val in (overrides or {}).items():
        _set_path(tree, tuple(dotted.split(".")), val)
    return build_section(Config, tree, "")  # validated on construction (_Checked)


def _check_record(cfg: Config) -> None:
    """Record/replay options (llmsim.api.cassette)."""
    def url(v: str, name: str) -> None:
        if not v.startswith(("http://", "https://")) or len(v) > 2048 or not v.isprintable() \
                or " " in v or len(v.split("://", 1)[1].split("/", 1)[0]) == 0:
            raise ConfigError(f"{name}: an http:// or https:// base URL, got {v[:100]!r}")

    if cfg.record_upstream is not None:
        url(cfg.record_upstream, "record_upstream")
    for r in cfg.record_route:
        name, eq, u = r.partition("=")
        if not eq or not (name in ("openai", "anthropic", "gemini", "ollama", "bedrock")
                          or name.startswith("/")):
            raise ConfigError(f"record_route: NAME=URL with NAME openai, anthropic, gemini, "
                              f"ollama, bedrock or a path prefix, got {r[:100]!r}")
        url(u, "record_route")
    recording = cfg.record_upstream is not None or bool(cfg.record_route)
    if cfg.replay is not None and recording:
        raise ConfigError("replay and record_upstream: one or the other (record with "
                          "--record-mode once or new_episodes to replay while recording)")
    if cfg.record_mode not in (None, "none") and not recording:
        raise ConfigError(f"record_mode: {cfg.record_mode} needs --record-upstream")
    if not 0 < cfg.upstream_read_timeout_s <= 86400 or not 0 < cfg.upstream_timeout_s <= 86400:
        raise ConfigError("upstream_read_timeout_s, upstream_timeout_s: seconds in (0, 86400]")
    if not 1024 <= cfg.record_max_bytes <= 1 << 30:
        raise ConfigError("record_max_bytes: between 1024 and 1073741824")
    if cfg.record_budget_bytes < 0:
        raise ConfigError("record_budget_bytes: must be >= 0")
    if len(cfg.match_ignore) > 64 or any(not 0 < len(f) <= 256 for f in cfg.match_ignore):
        raise ConfigError("match_ignore: at most 64 field names of 1 to 256 characters")


def _check(cfg: Config) -> None:
    if not (cfg.loop_watch_ms == 0 or 1 <= cfg.loop_watch_ms <= 10_000):
        raise ConfigError("loop_watch_ms: 0 (off) or 1 to 10000")
    if not 0 < len(cfg.default_model) <= 256 or not cfg.default_model.isprintable():
        raise ConfigError("default_model: a model id of 1 to 256 printable characters")
    if cfg.replay_speed < 0:
        raise ConfigError("replay_speed: must be >= 0")
    _check_record(cfg)
    if len(cfg.aws_keys) > 1024 or any(
            not 0 < len(k.partition(":")[0]) <= 128 or not 0 < len(k.partition(":")[2]) <= 256
            or not k.isprintable() or "/" in k.partition(":")[0] for k in cfg.aws_keys):
        raise ConfigError("aws_keys: at most 1024 ACCESS_KEY_ID:SECRET pairs")
    if len(cfg.azure_deployments) > 1024 or any(
            not 0 < len(d.partition("=")[0]) <= 256 or not 0 < len(d.partition("=")[2]) <= 256
            or not d.isprintable() for d in cfg.azure_deployments):
        raise ConfigError("azure_deployments: at most 1024 NAME=MODEL pairs (each part 1 to 256 "
                          "printable characters)")
    if len(cfg.served_model_name) > 256 or any(
            not 0 < len(n) <= 256 or not n.isprintable() for n in cfg.served_model_name):
        raise ConfigError("served_model_name: at most 256 ids of 1 to 256 printable characters")
    if cfg.state is not None and not cfg.state.startswith(("redis://", "rediss://",
                                                           "unix://")):
        raise ConfigError("state: a redis://HOST:PORT/DB URL (or rediss://, unix://)")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError("port: must be between 0 and 65535")
    w = str(cfg.workers).strip().lower()
    if w != "auto" and (not w.isdigit() or int(w) < 1):
        raise ConfigError(f"workers: {cfg.workers!r} is not a positive integer or 'auto'")
    for name in ("ttft_ms", "itl_ms"):
        v = getattr(cfg, name)
        if v is not None and v < 0:
            raise ConfigError(f"{name}: must be >= 0")
    if cfg.tool_call_probability is not None and not 0.0 <= cfg.tool_call_probability <= 1.0:
        raise ConfigError("tool_call_probability: must be between 0 and 1")
    if cfg.output_tokens_min < 1 or cfg.output_tokens_max < cfg.output_tokens_min:
        raise ConfigError("output_tokens_min/max: need 1 <= min <= max")
    if cfg.output_tokens_mean is not None and not 0 < cfg.output_tokens_mean <= 1e6 \
            or not 0 <= cfg.output_tokens_sigma <= 10:
        raise ConfigError("output_tokens_mean must be > 0 (at most 1e6) and output_tokens_sigma "
                          "between 0 and 10")
    if cfg.output_tokens_max > 1 << 20:
        raise ConfigError("output_tokens_max: at most 1048576")
    mode = cfg.max_tokens_mode
    if mode not in ("natural", "exact", "cap") and not (
            mode.startswith("trace:") and len(mode) > len("trace:")):
        raise ConfigError(f"max_tokens_mode: {mode!r} is not 'natural', 'exact' or "
                          "'trace:FILE'")
    _check_engine(cfg.engine, "engine")
    if not 0.001 <= cfg.time_scale <= 1000.0:
        raise ConfigError("time_scale: must be between 0.001 and 1000")
    if not 1 <= cfg.data_parallel <= MAX_DATA_PARALLEL:
        raise ConfigError(f"data_parallel: must be between 1 and {MAX_DATA_PARALLEL}")
    if not 0 <= cfg.prompt_cache_bytes <= 1 << 40:
        raise ConfigError("prompt_cache_bytes: must be between 0 and 2^40")
    if cfg.write_stall_timeout_s < 0:
        raise ConfigError("write_stall_timeout_s: must be >= 0")
    if not 0 <= cfg.journal <= 1_000_000:
        raise ConfigError("journal: between 0 (off) and 1000000 requests")
    if cfg.journal_max_bytes < MIN_BYTE_BOUND:
        raise ConfigError(f"journal_max_bytes: must be at least {MIN_BYTE_BOUND}")
    for name in ("max_body_bytes", "max_header_bytes", "max_pipelined", "max_input_items"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name}: must be >= 1")
    for k in cfg.admin_key:
        if not k or not all("!" <= c <= "~" for c in k):
            raise ConfigError("admin_key: each key must be non-empty printable ASCII without "
                              "spaces (it travels in an HTTP header)")


_PREFIX: dict[type, str] = {WebSocketConfig: "websocket.", ResponsesConfig: "responses.",
                            FaultRates: "faults.", FaultsConfig: "faults.", Limits: "ratelimit.",
                            RateLimitConfig: "ratelimit.", EngineSpec: "capacity.",
                            CapacityConfig: "capacity.", ModelSpec: "models.", Config: ""}


def _type_ok(value: Any, tp: Any) -> bool:
    base, optional = _strip_optional(tp)
    if value is None:
        return optional
    origin = typing.get_origin(base)
    if origin is Literal:
        return value in typing.get_args(base)
    if base is bool:
        return type(value) is bool
    if base is int:
        return type(value) is int
    if base is float:
        return type(value) in (int, float)
    if base is str:
        return type(value) is str
    if _is_section(base):
        return isinstance(value, base)
    if origin in (typing.Union, types.UnionType):  # e.g. int | str
        return any(_type_ok(value, a) for a in typing.get_args(base))
    if origin is not None and isinstance(origin, type):  # Mapping[...], list[...], tuple[...]
        return isinstance(value, origin)
    return True


def _check_types(obj: Any) -> None:
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if not _type_ok(v, hints[f.name]):
            name = _PREFIX.get(type(obj), "") + f.name
            raise ConfigError(f"{name}: {v!r} is not a valid value (expected "
                              f"{_type_name(hints[f.name])})")


def _type_name(tp: Any) -> str:
    base, optional = _strip_optional(tp)
    if typing.get_origin(base) is Literal:
        txt = "one of " + ", ".join(map(repr, typing.get_args(base)))
    else:
        txt = getattr(base, "__name__", None) or str(base)
    return txt + (" or None" if optional else "")
