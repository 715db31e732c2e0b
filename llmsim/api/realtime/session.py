"""The Realtime session's configuration: ``session.update`` (and ``response.create``'s
overrides) validated into a :class:`Session`, rendered back as the SDK's
``RealtimeSessionCreateRequest`` in ``session.created`` / ``session.updated``.

Every accepted field does what the real API does, or is listed in :data:`IGNORED` (accepted,
echoed, no effect in the simulation). Bad input is an :class:`~llmsim.errors.APIError` naming
the parameter (``session.audio.output.speed``), sent as the Realtime ``error`` event.
"""

from __future__ import annotations

import copy
from typing import Any

from ...errors import E, missing
from ...sim import schema as sch
from ...sim.decide import TOOL_CHOICES, Tool, ToolChoice
from .audio import FORMATS, VOICES

__all__ = ["Session", "IGNORED", "parse_tools", "parse_tool_choice", "parse_format",
           "parse_max_output", "parse_modalities", "MAX_INSTRUCTIONS", "MAX_TOOLS"]

MAX_INSTRUCTIONS = 256 * 1024  # characters of instructions (a simulator bound)
MAX_TOOLS = 128
MAX_OUTPUT_TOKENS = 4096  # the Realtime models' output limit ("inf" means this)
NAME_CHARS = 64
# accepted and echoed; no effect on the simulation
IGNORED = ("tracing", "truncation", "include", "prompt", "reasoning", "noise_reduction")
_SESSION_KEYS = frozenset({"type", "model", "instructions", "output_modalities", "audio",
                           "tools", "tool_choice", "max_output_tokens", "parallel_tool_calls",
                           "tracing", "truncation", "include", "prompt", "reasoning"})
_VAD_KEYS = {"server_vad": frozenset({"type", "threshold", "prefix_padding_ms",
                                      "silence_duration_ms", "create_response",
                                      "interrupt_response", "idle_timeout_ms"}),
             "semantic_vad": frozenset({"type", "eagerness", "create_response",
                                        "interrupt_response"})}
EAGERNESS_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 200}


def _obj(v: Any, p: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise E.invalid_type.at(p, expected="an object")
    return v


def _unknown(d: dict[str, Any], allowed: frozenset[str], p: str) -> None:
    for k in d:
        if k not in allowed:
            raise E.unknown_parameter.at(f"{p}.{k}")


def _bool(v: Any, p: str) -> bool:
    if not isinstance(v, bool):
        raise E.not_a_boolean.at(p)
    return v


def _num(v: Any, p: str, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        raise E.invalid_type.at(p, expected="an integer" if integer else "a number")
    if not lo <= v <= hi:
        raise E.out_of_range.at(p, lo=lo, hi=hi, value=v)
    return v


def _str(v: Any, p: str, cap: int = 4096) -> str:
    if not isinstance(v, str):
        raise E.invalid_type.at(p, expected="a string")
    if len(v) > cap:
        raise E.string_too_long.at(p, max_len=cap, length=len(v))
    return v


def parse_format(v: Any, p: str) -> dict[str, Any]:
    f = _obj(v, p)
    _unknown(f, frozenset({"type", "rate"}), p)
    t = f.get("type", "audio/pcm")
    if t not in FORMATS:
        raise E.invalid_value.at(f"{p}.type", value=str(t)[:64],
                                 allowed=", ".join(f"'{x}'" for x in FORMATS))
    if t == "audio/pcm":
        rate = f.get("rate", 24000)
        if rate != 24000 or isinstance(rate, bool):
            raise E.invalid_value.at(f"{p}.rate", value=str(rate)[:32], allowed="24000")
        return {"type": t, "rate": 24000}
    if "rate" in f:
        raise E.unknown_parameter.at(f"{p}.rate")
    return {"type": t}


def parse_modalities(v: Any, p: str) -> list[str]:
    if not isinstance(v, list):
        raise E.invalid_type.at(p, expected="an array")
    if len(v) != 1 or v[0] not in ("text", "audio"):
        raise E.invalid_value.at(p, value=str(v)[:64], allowed="['text'], ['audio']")
    return [v[0]]


def parse_max_output(v: Any, p: str) -> int | str:
    if v == "inf":
        return "inf"
    return int(_num(v, p, 1, MAX_OUTPUT_TOKENS, integer=True))


def parse_tools(v: Any, p: str, work: sch.Work) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise E.invalid_type.at(p, expected="an array")
    if len(v) > MAX_TOOLS:
        raise E.array_too_long.at(p, max_len=MAX_TOOLS, length=len(v))
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, t in enumerate(v):
        tp = f"{p}[{i}]"
        t = _obj(t, tp)
        kind = t.get("type", "function")
        if kind != "function":
            raise E.invalid_value.at(f"{tp}.type", value=str(kind)[:64],
                                     allowed="'function' (MCP tools are not simulated)")
        _unknown(t, frozenset({"type", "name", "description", "parameters"}), tp)
        name = t.get("name")
        if name is None:
            raise missing(f"{tp}.name")
        name = _str(name, f"{tp}.name", NAME_CHARS)
        if not name or not all(c.isalnum() or c in "_-" for c in name) or not name.isascii():
            raise E.name_pattern.at(f"{tp}.name")
        if name in names:
            raise E.duplicate_tool_name.at(f"{tp}.name", name=name)
        names.add(name)
        desc = _str(t.get("description", ""), f"{tp}.description", 16384)
        params = t.get("parameters")
        if params is not None:
            _obj(params, f"{tp}.parameters")
            sch.check(params, param=f"{tp}.parameters", label=f"function '{name}'",
                      code="invalid_function_parameters", work=work)
        tool: dict[str, Any] = {"type": "function", "name": name, "description": desc}
        if params is not None:
            tool["parameters"] = params
        out.append(tool)
    return out


def parse_tool_choice(v: Any, p: str, tools: list[dict[str, Any]]) -> Any:
    if isinstance(v, str):
        if v not in TOOL_CHOICES:
            raise E.invalid_value.at(p, value=v[:64], allowed="'none', 'auto', 'required'")
        return v
    tc = _obj(v, p)
    if tc.get("type") != "function":
        raise E.invalid_value.at(f"{p}.type", value=str(tc.get("type"))[:64],
                                 allowed="'function'")
    name = tc.get("name")
    if not isinstance(name, str):
        raise missing(f"{p}.name")
    if name not in {t["name"] for t in tools}:
        raise E.tool_choice_not_in_tools.at(p, name=name[:64])
    return {"type": "function", "name": name}


def tool_choice_of(v: Any) -> ToolChoice:
    if isinstance(v, str):
        return TOOL_CHOICES[v]
    return ToolChoice("named", frozenset([v["name"]]))


def decide_tools(tools: list[dict[str, Any]], p: str) -> tuple[Tool, ...]:
    return tuple(Tool(t["name"], "function", t.get("parameters"), None, False,
                      f"{p}[{i}].parameters", t.get("description") or "")
                 for i, t in enumerate(tools))


class Session:
    """One connection's session (the wire shape kept as plain values)."""

    def __init__(self, model: str) -> None:
        self.id = ""
        self.model = model
        self.instructions = ("You are a helpful, witty, and friendly AI. Act like a human, "
                             "but remember that you aren't one.")
        self.output_modalities = ["audio"]
        self.in_format: dict[str, Any] = {"type": "audio/pcm", "rate": 24000}
        self.out_format: dict[str, Any] = {"type": "audio/pcm", "rate": 24000}
        self.voice = "alloy"
        self.speed = 1.0
        self.turn_detection: dict[str, Any] | None = {
            "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
            "silence_duration_ms": 200, "create_response": True, "interrupt_response": True,
            "idle_timeout_ms": None}
        self.transcription: dict[str, Any] | None = None
        self.noise_reduction: Any = None
        self.tools: list[dict[str, Any]] = []
        self.tool_choice: Any = "auto"
        self.max_output_tokens: int | str = "inf"
        self.parallel_tool_calls = True
        self.extra: dict[str, Any] = {"tracing": None, "truncation": "auto"}

    def wire(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "type": "realtime", "object": "realtime.session", "id": self.id,
            "model": self.model, "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "audio": {"input": {"format": dict(self.in_format),
                                "transcription": copy.deepcopy(self.transcription),
                                "noise_reduction": copy.deepcopy(self.noise_reduction),
                                "turn_detection": copy.deepcopy(self.turn_detection)},
                      "output": {"format": dict(self.out_format), "voice": self.voice,
                                 "speed": self.speed}},
            "tools": copy.deepcopy(self.tools), "tool_choice": copy.deepcopy(self.tool_choice),
            "max_output_tokens": self.max_output_tokens}
        for k, v in self.extra.items():
            s[k] = copy.deepcopy(v)
        return s

    def vad_silence_ms(self) -> int:
        td = self.turn_detection or {}
        if td.get("type") == "semantic_vad":
            return EAGERNESS_SILENCE_MS[td.get("eagerness") or "auto"]
        return int(td.get("silence_duration_ms", 200))

    def update(self, raw: Any, work: sch.Work) -> None:
        """Apply a ``session.update`` (all or nothing: a bad field changes nothing)."""
        d = _obj(raw, "session")
        _unknown(d, _SESSION_KEYS, "session")
        t = d.get("type")
        if t is None:
            raise missing("session.type")
        if t != "realtime":
            raise E.invalid_value.at("session.type", value=str(t)[:64],
                                     allowed="'realtime' (transcription sessions are not "
                                     "simulated)")
        new = copy.copy(self)
        if "model" in d:
            m = _str(d["model"], "session.model", 256)
            if m != self.model:
                raise E.invalid_value.at("session.model", value=m,
                                         allowed=f"'{self.model}' (the model is set when "
                                         "connecting)")
        if "instructions" in d:
            new.instructions = _str(d["instructions"], "session.instructions",
                                    MAX_INSTRUCTIONS)
        if "output_modalities" in d:
            new.output_modalities = parse_modalities(d["output_modalities"],
                                                     "session.output_modalities")
        if "tools" in d:
            new.tools = parse_tools(d["tools"], "session.tools", work)
        if "tool_choice" in d:
            new.tool_choice = parse_tool_choice(d["tool_choice"], "session.tool_choice",
                                                new.tools)
        elif isinstance(new.tool_choice, dict) and new.tool_choice["name"] not in {
                t["name"] for t in new.tools}:
            new.tool_choice = "auto"
        if "max_output_tokens" in d:
            new.max_output_tokens = parse_max_output(d["max_output_tokens"],
                                                     "session.max_output_tokens")
        if "parallel_tool_calls" in d:
            new.parallel_tool_calls = _bool(d["parallel_tool_calls"],
                                            "session.parallel_tool_calls")
        new.extra = dict(self.extra)
        for k in ("tracing", "truncation", "include", "prompt", "reasoning"):
            if k in d:
                new.extra[k] = d[k]
        if "audio" in d:
            self._audio(new, _obj(d["audio"], "session.audio"))
        for k, v in vars(new).items():
            setattr(self, k, v)

    @staticmethod
    def _audio(new: Session, a: dict[str, Any]) -> None:
        p = "session.audio"
        _unknown(a, frozenset({"input", "output"}), p)
        if "input" in a:
            i = _obj(a["input"], f"{p}.input")
            _unknown(i, frozenset({"format", "transcription", "noise_reduction",
                                   "turn_detection"}), f"{p}.input")
            if "format" in i:
                new.in_format = parse_format(i["format"], f"{p}.input.format")
            if "transcription" in i:
                new.transcription = _transcription(i["transcription"],
                                                   f"{p}.input.transcription")
            if "noise_reduction" in i:
                nr = i["noise_reduction"]
                if nr is not None:
                    _obj(nr, f"{p}.input.noise_reduction")
                    if nr.get("type") not in ("near_field", "far_field"):
                        raise E.invalid_value.at(f"{p}.input.noise_reduction.type",
                                                 value=str(nr.get("type"))[:64],
                                                 allowed="'near_field', 'far_field'")
                new.noise_reduction = nr
            if "turn_detection" in i:
                new.turn_detection = _turn_detection(i["turn_detection"],
                                                     f"{p}.input.turn_detection")
        if "output" in a:
            o = _obj(a["output"], f"{p}.output")
            _unknown(o, frozenset({"format", "voice", "speed"}), f"{p}.output")
            if "format" in o:
                new.out_format = parse_format(o["format"], f"{p}.output.format")
            if "voice" in o:
                new.voice = parse_voice(o["voice"], f"{p}.output.voice")
            if "speed" in o:
                new.speed = float(_num(o["speed"], f"{p}.output.speed", 0.25, 1.5))


def parse_voice(v: Any, p: str) -> str:
    if not isinstance(v, str) or v not in VOICES:
        raise E.invalid_value.at(p, value=str(v)[:64],
                                 allowed=", ".join(f"'{x}'" for x in VOICES))
    return v


def _transcription(v: Any, p: str) -> dict[str, Any] | None:
    if v is None:
        return None
    t = _obj(v, p)
    _unknown(t, frozenset({"model", "language", "prompt", "delay", "keywords",
                           "languages"}), p)
    out: dict[str, Any] = {}
    out["model"] = _str(t.get("model", "whisper-1"), f"{p}.model", 256)
    if "language" in t:
        out["language"] = _str(t["language"], f"{p}.language", 16)
    if "prompt" in t:
        out["prompt"] = _str(t["prompt"], f"{p}.prompt", 16384)
    return out


def _turn_detection(v: Any, p: str) -> dict[str, Any] | None:
    if v is None:
        return None
    td = _obj(v, p)
    kind = td.get("type")
    if kind not in _VAD_KEYS:
        raise E.invalid_value.at(f"{p}.type", value=str(kind)[:64],
                                 allowed="'server_vad', 'semantic_vad'")
    _unknown(td, _VAD_KEYS[kind], p)
    create = _bool(td.get("create_response", True), f"{p}.create_response")
    interrupt = _bool(td.get("interrupt_response", True), f"{p}.interrupt_response")
    if kind == "semantic_vad":
        eager = td.get("eagerness", "auto")
        if eager not in EAGERNESS_SILENCE_MS:
            raise E.invalid_value.at(f"{p}.eagerness", value=str(eager)[:64],
                                     allowed="'low', 'medium', 'high', 'auto'")
        return {"type": kind, "eagerness": eager, "create_response": create,
                "interrupt_response": interrupt}
    idle = td.get("idle_timeout_ms")
    if idle is not None:
        idle = int(_num(idle, f"{p}.idle_timeout_ms", 5000, 30000, integer=True))
    return {"type": kind,
            "threshold": float(_num(td.get("threshold", 0.5), f"{p}.threshold", 0.0, 1.0)),
            "prefix_padding_ms": int(_num(td.get("prefix_padding_ms", 300),
                                          f"{p}.prefix_padding_ms", 0, 10000, integer=True)),
            "silence_duration_ms": int(_num(td.get("silence_duration_ms", 200),
                                            f"{p}.silence_duration_ms", 0, 10000,
                                            integer=True)),
            "create_response": create, "interrupt_response": interrupt,
            "idle_timeout_ms": idle}


