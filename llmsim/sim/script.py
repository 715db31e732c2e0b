"""Scripted replies: rules that answer matching requests with given turns, per session.

A script (``--script FILE``, JSON or TOML; or ``POST /llmsim/scripts`` at run time) is
``{"rules": [rule, ...]}``. A rule is ``{"match": {...}, "reply": [turn, ...], "then": ...}``:

- ``match`` (every given field must hold; none given matches everything): ``model``,
  ``endpoint`` (``chat.completions``, ``responses``, ``completions``, ``anthropic.messages``,
  ``gemini.generate``, ``ollama.chat``, ``ollama.generate``, ``bedrock.converse``,
  ``bedrock.invoke``; the media endpoints ``images``, ``audio.speech``,
  ``audio.transcriptions``, ``audio.translations``, ``moderations``, whose text is the
  prompt, input or input item),
  ``api_key``, ``session`` (the ``X-LLMSim-Session`` header), ``contains`` (a substring of the
  last user message), ``regex`` (searched in it, with the linear matcher of
  :mod:`llmsim.sim.schema`: no backtracking), ``tool_result`` (true: the request carries a
  tool result after the last user message; false: it does not), ``turn`` (the 1-based number
  of this session's requests that matched this rule).
- ``reply``: the turns given in order, one per matching request of the session. A turn has
  ``text``, ``tool_calls`` (``[{"name", "arguments": {...} | "generate"}]``, "generate" =
  schema-valid arguments from the request's tool), ``reasoning`` (text of the hidden
  reasoning / thinking), or instead ``error`` (``{"status", "message", "type", "code",
  "retry_after_s"}``) or ``fault`` (a spec of the fault grammar: a status such as ``429``, or a
  mid-stream fault such as ``disconnect-after:3``); a moderations turn is ``flag`` (the
  categories to flag, e.g. ``["violence"]``), a transcription's ``text`` is its transcript.
- ``then`` (exhaustion): ``repeat`` the last turn (default), ``loop`` from the first,
  ``error`` (a 400 naming the rule), or ``simulate`` (fall back to the simulation).

Cursors are per session: the ``X-LLMSim-Session`` header, else the session of the response a
``previous_response_id`` continues, else the request's ``conversation``, else the API key, else
one shared anonymous session; parallel agents that send their own
header each get their own run of the script. A scripted turn becomes a
:class:`~llmsim.sim.decide.Decision`, so every dialect and transport renders it as it renders
the simulation: tokens paced at the configured latency, tool calls streamed as argument
deltas, usage counting them.

Bounds: :data:`MAX_SCRIPT_BYTES` of script, :data:`MAX_RULES` rules, :data:`MAX_TURNS` turns
a rule, :data:`MAX_TEXT` characters a text, regexes of :data:`MAX_PATTERN` characters matched
against at most :data:`MATCH_CHARS` characters, :data:`MAX_SESSIONS` cursors (least recently
used dropped).
"""

from __future__ import annotations

import hashlib
import random
import tomllib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import APIError, E, scripted
from . import schema as sch
from . import tokens as tok
from .decide import CALL_TOKENS, Ask, Call, Choice, Decision, Reasoning, Timing, Usage
from .faults import Fault, parse_spec
from .latency import Latency
from .moderation import CATEGORIES
from .rng import new_id

__all__ = ["Script", "ScriptError", "load_script", "parse_script", "session_key"]

MAX_SCRIPT_BYTES = 1 << 20
MAX_RULES = 256
MAX_TURNS = 1024
MAX_TEXT = 64 * 1024
MAX_PATTERN = 1000
MATCH_CHARS = 64 * 1024
# steps the regex rules of one request may take together: a cached DFA step is one, so every
# pattern the matcher caches searches all MATCH_CHARS with room to spare
REGEX_WORK = 16 * MATCH_CHARS
MAX_SESSIONS = 10_000
ENDPOINTS = ("chat.completions", "responses", "completions", "anthropic.messages", "realtime",
             "gemini.generate", "ollama.chat", "ollama.generate", "bedrock.converse",
             "bedrock.invoke", "images", "audio.speech", "audio.transcriptions",
             "audio.translations", "moderations")
THEN = ("repeat", "loop", "error", "simulate")
SESSION_HEADER = "x-llmsim-session"


class ScriptError(ValueError):
    """An invalid script; the message names the place (``rules[2].reply[0].text``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True, slots=True)
class Turn:
    text: str | None = None
    tool_calls: tuple[tuple[str, Any], ...] = ()  # (name, arguments dict | "generate")
    reasoning: str | None = None
    error: APIError | None = None
    fault: Fault | None = None
    flag: tuple[str, ...] = ()  # moderations: the categories flagged


@dataclass(frozen=True, slots=True)
class Rule:
    match: Mapping[str, Any]
    reply: tuple[Turn, ...]
    then: str
    source: dict[str, Any]  # as given (GET /llmsim/scripts shows it)


def _str(v: Any, where: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(v, str):
        raise ScriptError(where, "expected a string")
    if len(v) > limit:
        raise ScriptError(where, f"longer than {limit} characters")
    return v


def _turn(t: Any, where: str) -> Turn:
    if not isinstance(t, dict):
        raise ScriptError(where, "expected an object")
    unknown = set(t) - {"text", "tool_calls", "reasoning", "error", "fault", "flag"}
    if unknown:
        raise ScriptError(where, f"unknown key {sorted(unknown)[0]!r}")
    if "error" in t:
        e = t["error"]
        if not isinstance(e, dict):
            raise ScriptError(f"{where}.error", "expected an object")
        status = e.get("status", 500)
        if type(status) is not int or not 400 <= status <= 599:
            raise ScriptError(f"{where}.error.status", "an HTTP error status (400-599)")
        ra = e.get("retry_after_s")
        if ra is not None and (type(ra) not in (int, float) or not 0 <= ra <= 3600):
            raise ScriptError(f"{where}.error.retry_after_s", "a number of seconds, 0-3600")
        headers = [] if ra is None else [("retry-after", str(int(ra))),
                                         ("retry-after-ms", str(int(ra * 1000)))]
        err = scripted(status, _str(e.get("message", f"Scripted error (HTTP {status})."),
                                    f"{where}.error.message"),
                       _str(e["type"], f"{where}.error.type", 64) if "type" in e else None,
                       _str(e["code"], f"{where}.error.code", 64) if "code" in e else None,
                       headers)
        return Turn(error=err)
    if "fault" in t:
        try:
            fault = parse_spec(_str(t["fault"], f"{where}.fault", 200), source="script")
        except ValueError as exc:
            raise ScriptError(f"{where}.fault", str(exc)) from None
        if fault.kind != "status" and not fault.mid_stream:
            raise ScriptError(f"{where}.fault", "a status (e.g. 429, 503) or a mid-stream "
                              "fault (e.g. disconnect-after:3); use an error turn otherwise")
        return Turn(fault=fault)
    if "flag" in t:
        flag = t["flag"]
        if not isinstance(flag, list) or any(f not in CATEGORIES for f in flag):
            raise ScriptError(f"{where}.flag", "a list of moderation categories: "
                              + ", ".join(CATEGORIES))
        return Turn(flag=tuple(flag))
    text = _str(t["text"], f"{where}.text") if "text" in t else None
    reasoning = _str(t["reasoning"], f"{where}.reasoning") if "reasoning" in t else None
    calls: list[tuple[str, Any]] = []
    raw = t.get("tool_calls", [])
    if not isinstance(raw, list) or len(raw) > 128:
        raise ScriptError(f"{where}.tool_calls", "expected a list of at most 128 calls")
    for j, c in enumerate(raw):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(c, dict):
            raise ScriptError(w, "expected an object")
        name = _str(c.get("name"), f"{w}.name", 64)
        args = c.get("arguments", "generate")
        if args != "generate" and not isinstance(args, dict):
            raise ScriptError(f"{w}.arguments", "an object or \"generate\"")
        if len(orjson.dumps(args)) > MAX_TEXT:
            raise ScriptError(f"{w}.arguments", f"larger than {MAX_TEXT} bytes")
        calls.append((name, args))
    if text is None and not calls:
        raise ScriptError(where, "a turn needs text, tool_calls, error, fault or flag")
    return Turn(text, tuple(calls), reasoning)


def _match(m: Any, where: str) -> dict[str, Any]:
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise ScriptError(where, "expected an object")
    out: dict[str, Any] = {}
    for k, v in m.items():
        w = f"{where}.{k}"
        if k in ("model", "api_key", "session", "contains"):
            out[k] = _str(v, w, 4096)
        elif k == "endpoint":
            if v not in ENDPOINTS:
                raise ScriptError(w, "one of " + ", ".join(ENDPOINTS))
            out[k] = v
        elif k == "regex":
            pattern = _str(v, w, MAX_PATTERN)
            rx = sch._regex(pattern)
            if rx.error is not None:
                raise ScriptError(w, f"the pattern {rx.error}")
            if rx.prog is None:
                why = rx.unsupported or ("backreferences, scoped flags such as (?i:...) and "
                                         "flags other than i, m, s, x are not supported")
                raise ScriptError(w, f"the linear matcher cannot run this pattern: {why}")
            out[k] = pattern
        elif k == "tool_result":
            if type(v) is not bool:
                raise ScriptError(w, "true or false")
            out[k] = v
        elif k == "turn":
            if type(v) is not int or v < 1:
                raise ScriptError(w, "a positive integer")
            out[k] = v
        else:
            raise ScriptError(w, "unknown match key")
    return out


def parse_script(data: Any) -> list[Rule]:
    """Validate a script (see the module doc); ScriptError names the first bad place."""
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise ScriptError("rules", "expected {\"rules\": [...]}")
    rules = data["rules"]
    if len(rules) > MAX_RULES:
        raise ScriptError("rules", f"at most {MAX_RULES} rules")
    out = []
    for i, r in enumerate(rules):
        w = f"rules[{i}]"
        if not isinstance(r, dict):
            raise ScriptError(w, "expected an object")
        unknown = set(r) - {"match", "reply", "then"}
        if unknown:
            raise ScriptError(f"{w}.{sorted(unknown)[0]}", "unknown key")
        reply = r.get("reply")
        if not isinstance(reply, list) or not reply or len(reply) > MAX_TURNS:
            raise ScriptError(f"{w}.reply", f"a list of 1 to {MAX_TURNS} turns")
        then = r.get("then", "repeat")
        if then not in THEN:
            raise ScriptError(f"{w}.then", "one of " + ", ".join(THEN))
        out.append(Rule(_match(r.get("match"), f"{w}.match"),
                        tuple(_turn(t, f"{w}.reply[{j}]") for j, t in enumerate(reply)),
                        then, r))
    return out


def load_script(path: str) -> list[Rule]:
    """Read and validate a JSON or TOML (``.toml``) script file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SCRIPT_BYTES + 1)
    except OSError as exc:
        raise ScriptError(path, f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SCRIPT_BYTES:
        raise ScriptError(path, f"larger than {MAX_SCRIPT_BYTES} bytes")
    try:
        data = tomllib.loads(raw.decode()) if path.endswith(".toml") else orjson.loads(raw)
    except (tomllib.TOMLDecodeError, orjson.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ScriptError(path, f"not valid {'TOML' if path.endswith('.toml') else 'JSON'}: "
                          f"{exc}") from None
    return parse_script(data)


def session_key(headers: Mapping[str, str], body: Mapping[str, Any], api_key: str | None,
                chains: Mapping[str, str] | None = None) -> str:
    """Whose cursor a request moves (see the module doc); ``chains`` maps the response ids
    this script answered to their session (a ``previous_response_id`` continues it)."""
    s = headers.get(SESSION_HEADER)
    if s:
        return "h:" + s[:256]
    prev = body.get("previous_response_id")
    if chains is not None and isinstance(prev, str) and prev in chains:
        return chains[prev]
    conv = body.get("conversation")
    if isinstance(conv, dict):
        conv = conv.get("id")
    if isinstance(conv, str) and conv:
        return "c:" + conv[:256]
    return "k:" + (api_key or "")[:256]


def _digest(rules: list[Rule]) -> str:
    """A short digest of a script's rules: replicas that load the same script share its
    cursors in Redis under it."""
    src = orjson.dumps([r.source for r in rules], option=orjson.OPT_SORT_KEYS,
                       default=str)
    return hashlib.blake2b(src, digest_size=8).hexdigest()


class Script:
    """The installed rules and the per-session cursors."""

    def __init__(self, rules: list[Rule] | None = None) -> None:
        self.rules: list[Rule] = rules or []
        self.digest = _digest(self.rules)  # names this script's shared cursors (--state)
        self._cursors: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._chains: OrderedDict[str, str] = OrderedDict()  # response id → session

    def install(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.digest = _digest(rules)
        self._cursors.clear()
        self._chains.clear()

    def view(self) -> dict[str, Any]:
        cur: dict[str, dict[str, int]] = {}
        for (i, s), n in self._cursors.items():
            cur.setdefault(str(i), {})[s] = n
        return {"object": "llmsim.script", "rules": [r.source for r in self.rules],
                "cursors": cur}

    def _matches(self, m: Mapping[str, Any], *, model: str, endpoint: str,
                 api_key: str | None, session: str | None, user_text: str,
                 tool_result: bool, work: sch.Work) -> bool:
        if "model" in m and m["model"] != model:
            return False
        if "endpoint" in m and m["endpoint"] != endpoint:
            return False
        if "api_key" in m and m["api_key"] != api_key:
            return False
        if "session" in m and m["session"] != session:
            return False
        if "tool_result" in m and m["tool_result"] != tool_result:
            return False
        text = user_text[:MATCH_CHARS]
        if "contains" in m and m["contains"] not in text:
            return False
        if "regex" in m:
            try:
                if sch._pattern_search(m["regex"], text, work) is not True:
                    return False
            except sch._OverBudget:  # the request's regex budget is spent: no match
                return False
        return True

    def candidates(self, *, model: str, endpoint: str, api_key: str | None,
                   headers: Mapping[str, str], ask: Ask) -> Iterator[tuple[int, int | None]]:
        """The rules this request matches, in order (lazily), each with its ``turn``
        condition: the cursor decides among them, the first whose condition holds takes the
        request."""
        session = headers.get(SESSION_HEADER)
        text = ask.user_text()
        work = sch.Work(REGEX_WORK)
        for i, rule in enumerate(self.rules):
            if self._matches(rule.match, model=model, endpoint=endpoint, api_key=api_key,
                             session=session, user_text=text,
                             tool_result=ask.after_tool_result, work=work):
                yield i, rule.match.get("turn")

    def reply(self, i: int, n: int) -> Turn | None:
        """Rule ``i``'s answer to its ``n``-th (0-based) request of a session: the turn, or
        what its ``then`` says once the turns are used up."""
        rule = self.rules[i]
        if n < len(rule.reply):
            return rule.reply[n]
        if rule.then == "repeat":
            return rule.reply[-1]
        if rule.then == "loop":
            return rule.reply[n % len(rule.reply)]
        if rule.then == "error":
            raise E.script_exhausted.at(rule=i, turns=len(rule.reply))
        return None  # "simulate"

    def turn(self, *, model: str, endpoint: str, api_key: str | None,
             headers: Mapping[str, str], body: Mapping[str, Any], ask: Ask,
             response_id: str | None = None) -> Turn | None:
        """The scripted turn for this request (moving its session's cursor), or None.
        ``response_id``: the Responses id this request creates (its follow-ups, sent with
        ``previous_response_id``, continue this session)."""
        if not self.rules:
            return None
        key = session_key(headers, body, api_key, self._chains)
        if response_id is not None:
            self._chains[response_id] = key
            while len(self._chains) > MAX_SESSIONS:
                self._chains.popitem(last=False)
        for i, want in self.candidates(model=model, endpoint=endpoint, api_key=api_key,
                                       headers=headers, ask=ask):
            ck = (i, key)
            n = self._cursors.get(ck, 0)
            if want is not None and n + 1 != want:
                continue
            self._cursors[ck] = n + 1
            self._cursors.move_to_end(ck)
            while len(self._cursors) > MAX_SESSIONS:
                self._cursors.popitem(last=False)
            return self.reply(i, n)
        return None


def decision_of(turn: Turn, ask: Ask, rng: random.Random, lat: Latency,
                work: sch.Work) -> Decision:
    """A scripted turn as the Decision every dialect renders (tokens exact, limit applied)."""
    enc = ask.profile.encoding
    limit = ask.limit
    reasoning = None
    r_tokens = 0
    if turn.reasoning:
        parts = tok.split_pieces(turn.reasoning, enc)
        r_tokens = len(parts)
        reasoning = Reasoning(r_tokens, [parts], None)
    tools = {t.name: t for t in ask.tools}
    calls: list[Call] = []
    used = 0
    cut = False
    for name, args in turn.tool_calls:
        t = tools.get(name)
        if args == "generate":
            args = sch.generate_tool_arguments(t.parameters if t is not None else None, rng,
                                               work=work, param=t.param if t else None)
        src = orjson.dumps(args).decode()
        pieces = tok.split_pieces(src, enc)
        n = len(pieces) + CALL_TOKENS
        if limit is not None and used + n > limit:
            cut = True
            break
        calls.append(Call(new_id("call_"), name, t.kind if t is not None else "function", src,
                          pieces, n))
        used += n
    choices = []
    for i in range(ask.n):
        if calls:
            finish = "length" if cut else "tool_calls"
            choices.append(Choice(i, None, tuple(calls), finish, used, reasoning))
            continue
        text_pieces = tok.split_pieces(turn.text or "", enc)
        finish = "stop"
        if limit is not None and len(text_pieces) > limit:
            text_pieces, finish = text_pieces[:limit], "length"
        choices.append(Choice(i, text_pieces, (), finish, len(text_pieces), reasoning))
    out = sum(c.tokens for c in choices) + r_tokens * ask.n
    first = lat.ttft(rng, ask.prompt_tokens)
    return Decision(tuple(choices), Usage(ask.prompt_tokens, out, r_tokens * ask.n,
                                          ask.cached_tokens),
                    Timing(first, lat, rng.getrandbits(64)))
