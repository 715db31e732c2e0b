"""Configuration: frozen dataclasses loaded from defaults < TOML file < ``LLMSIM_*`` env < flags.

Every scalar field of :class:`Config` (and of its section dataclasses) becomes a command-line
flag and an environment variable automatically, so option plumbing is written once: the field's
``metadata["help"]`` is its ``--help`` text. A section field ``capacity.max_seqs`` becomes the
flag ``--capacity-max-seqs``, the env var ``LLMSIM_CAPACITY_MAX_SEQS`` and the TOML key
``max_seqs`` in table ``[capacity]``. Unknown keys anywhere are an error naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Config", "ConfigError", "ModelSpec", "load_config", "iter_options"]


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names it."""


def opt(default: Any, help: str, *, flag: bool = True, choices: tuple[Any, ...] | None = None,
        metavar: str | None = None) -> Any:
    """A dataclass field with CLI/env metadata."""
    md = {"help": help, "flag": flag, "choices": choices, "metavar": metavar}
    if isinstance(default, (list, dict, tuple)) and not isinstance(default, tuple):
        return field(default_factory=lambda: type(default)(default), metadata=md)
    return field(default=default, metadata=md)


@dataclass(frozen=True)
class ModelSpec:
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
    encoding: str | None = None
    created: int | None = None


@dataclass(frozen=True)
class Config:
    """Server configuration. Frozen; build one with :func:`load_config` or directly."""

    # --- network -------------------------------------------------------------------------
    host: str = opt("127.0.0.1", "Address to bind (use 0.0.0.0 to listen on all interfaces).")
    port: int = opt(8080, "TCP port to bind; 0 picks a free port (printed on start).")
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
    strict_models: bool = opt(False, "Reject unknown model ids with 404 model_not_found "
                              "(default: accept any id with the default profile).")
    text: Literal["lorem", "echo", "fixed", "sequence"] = opt(
        "lorem", "Text generator: lorem (sentences of single-token words), echo (repeat the last "
        "user message), fixed (--fixed-text), sequence (1,2,3,...).",
        choices=("lorem", "echo", "fixed", "sequence"))
    fixed_text: str = opt("Hello! This is a simulated response from llmsim.",
                          "The text used by --text fixed.", metavar="TEXT")
    output_tokens_mean: float = opt(150.0, "Mean completion length in tokens when the request "
                                    "sets no limit (log-normal distribution).", metavar="N")
    output_tokens_sigma: float = opt(0.5, "Log-normal sigma of the completion length "
                                     "(0 = always the mean).", metavar="S")
    output_tokens_min: int = opt(1, "Smallest drawn completion length.", metavar="N")
    output_tokens_max: int = opt(2048, "Largest drawn completion length (a request's own "
                                 "max_tokens always wins).", metavar="N")
    max_tokens_mode: Literal["exact", "cap"] = opt(
        "exact", "How a request's max_tokens is used by generated text (lorem, sequence): "
        "'exact' always produces exactly max_tokens tokens (finish_reason 'length', what "
        "benchmarks want); 'cap' draws a natural length and only cuts at max_tokens.",
        choices=("exact", "cap"))
    tool_call_probability: float = opt(0.5, "Probability that the model calls a tool when "
                                       "tools are given and tool_choice is 'auto'.", metavar="P")
    # --- limits and timeouts -------------------------------------------------------------
    max_body_bytes: int = opt(32 * 1024 * 1024, "Largest accepted request body (413 above).",
                              metavar="BYTES")
    max_header_bytes: int = opt(32 * 1024, "Largest accepted request head (431 above).",
                                metavar="BYTES")
    max_pipelined: int = opt(32, "Most pipelined requests buffered per connection before the "
                             "server stops reading from it.", metavar="N")
    header_timeout_s: float = opt(10.0, "Close a connection whose request head has not arrived "
                                  "within this many seconds (slowloris guard).", metavar="S")
    idle_timeout_s: float = opt(75.0, "Close an idle keep-alive connection after this many "
                                "seconds.", metavar="S")
    shutdown_grace_s: float = opt(10.0, "On SIGINT/SIGTERM, let in-flight requests finish for "
                                  "this many seconds before closing them.", metavar="S")
    # --- misc ----------------------------------------------------------------------------
    quiet: bool = opt(False, "Do not print the start-up banner.")
    models: Mapping[str, ModelSpec] = opt({}, "Extra or overridden models ([models.\"id\"] tables "
                                          "in the config file).", flag=False)

    def replace(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


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
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
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
        obj = cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{name or 'config'}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
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


def load_config(file: str | os.PathLike[str] | None = None,
                env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Build a Config: defaults < TOML ``file`` < ``LLMSIM_*`` in ``env`` < ``overrides``.

    ``overrides`` maps dotted paths (``"port"``, ``"capacity.max_seqs"``) to values.
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
            raise ConfigError(f"unknown environment variable {key}")
        _set_path(tree, o.path, coerce(val, o.type, key))
    for dotted, val in (overrides or {}).items():
        _set_path(tree, tuple(dotted.split(".")), val)
    cfg = build_section(Config, tree, "")
    _check(cfg)
    return cfg


def _check(cfg: Config) -> None:
    if not 0 <= cfg.port <= 65535:
        raise ConfigError("port: must be between 0 and 65535")
    for name in ("ttft_ms", "itl_ms"):
        v = getattr(cfg, name)
        if v is not None and v < 0:
            raise ConfigError(f"{name}: must be >= 0")
    if not 0.0 <= cfg.tool_call_probability <= 1.0:
        raise ConfigError("tool_call_probability: must be between 0 and 1")
    if cfg.output_tokens_min < 1 or cfg.output_tokens_max < cfg.output_tokens_min:
        raise ConfigError("output_tokens_min/max: need 1 <= min <= max")
    if cfg.output_tokens_mean <= 0 or cfg.output_tokens_sigma < 0:
        raise ConfigError("output_tokens_mean must be > 0 and output_tokens_sigma >= 0")
    for name in ("max_body_bytes", "max_header_bytes", "max_pipelined"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name}: must be >= 1")
