"""Simulated hosted tools of the Responses API: their items, status transitions and events.

The model chooses hosted tools by the same policy as function tools: each hosted tool is a
:class:`~llmsim.sim.decide.Tool` of the decision (:func:`decide_tools`: named by its family,
described by what it is for, so the user's words, ``tool_choice`` and scripts pick it as
they pick a function). A hosted call of the decision then becomes the tool's items
(:func:`response_out`):

- run by the server (``web_search``, ``file_search``, ``code_interpreter``,
  ``image_generation``, ``mcp``): its call item with its events in the real order and the
  tool's time (:func:`llmsim.sim.hosted.seconds`), then the model answers in a message (a
  second decision: it reads the results) citing what was found (``url_citation`` whose
  offsets slice the text, ``file_citation``);
- run by the client (``computer_use_preview``/``computer``, ``shell``, ``local_shell``,
  ``apply_patch``): the call item, and the response ends (as with a function call); the
  client's ``*_output`` item comes back on the next turn;
- MCP: the server's tools are listed once per context (``mcp_list_tools``); a tool that
  needs approval (``require_approval``, "always" by default as in the real API) gives an
  ``mcp_approval_request``; an ``mcp_approval_response`` that approves it runs the call.

Scripted turns name a hosted tool by its family (``web_search``, ``file_search``,
``code_interpreter``, ``image_generation``, ``computer``, ``shell``, ``local_shell``,
``apply_patch``) or ``mcp:<server_label>``, with arguments that fix what it finds
(:func:`_script`).
"""

from __future__ import annotations

import base64
import random
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import E, missing, quoted
from ...sim import hosted as sim
from ...sim import tokens as tok
from ...sim.decide import AUTO, Ask, Decision, Tool, ToolChoice, Usage, decide
from ...sim.prompt import count_json
from ...sim.rng import derive, new_id
from ..validate import got
from .render import INCOMPLETE, CallOut, HostedOut, MessageOut, ReasoningOut, RespOut

if TYPE_CHECKING:
    from ...config import Config
    from ...sim.latency import Latency
    from .request import RespRequest

__all__ = ["FAMILY", "check_tools", "decide_tools", "forced", "response_out", "input_item",
           "INPUT_TYPES", "CALL_OF_OUTPUT", "involved", "check_approvals", "MAX_TOOLS", "MAX_MCP_SERVERS",
           "MAX_ALLOWED_TOOLS", "MAX_VECTOR_STORES", "MAX_PENDING_APPROVALS"]

Item = dict[str, Any]
MAX_TOOLS = 128  # tools a request
MAX_MCP_SERVERS = 16  # tools of type mcp a request
MAX_ALLOWED_TOOLS = 64  # names in one mcp tool's allowed_tools
MAX_VECTOR_STORES = 16  # ids in one file_search tool's vector_store_ids
MAX_PENDING_APPROVALS = 16  # mcp_approval_response items one input answers
MAX_DOMAINS = 100  # web_search filters.allowed_domains

# tool type -> the family the decision knows it by
FAMILY = {"web_search": "web_search", "web_search_2025_08_26": "web_search",
          "web_search_preview": "web_search", "web_search_preview_2025_03_11": "web_search",
          "file_search": "file_search", "code_interpreter": "code_interpreter",
          "image_generation": "image_generation", "computer_use_preview": "computer",
          "computer": "computer", "shell": "shell", "local_shell": "local_shell",
          "apply_patch": "apply_patch", "mcp": "mcp"}
# what each is for: the agent policy matches these words with the user's
_FOR = {"web_search": "search the web internet online for latest news current events today "
                      "prices sources",
        "file_search": "search files documents knowledge base uploaded manual policy pdf",
        "code_interpreter": "run python code calculate compute execute math statistics "
                            "average data analysis",
        "image_generation": "generate draw create image picture illustration photo logo",
        "computer": "use the computer screen click browser website open navigate",
        "shell": "run shell command terminal list directory files",
        "local_shell": "run shell command terminal list directory files",
        "apply_patch": "edit patch file code change write create update"}
CLIENT_RUN = frozenset(("computer", "shell", "local_shell", "apply_patch"))
# forced tool_choice types -> family
_CHOICE = {"web_search_preview": "web_search", "web_search_preview_2025_03_11": "web_search",
           "file_search": "file_search", "code_interpreter": "code_interpreter",
           "image_generation": "image_generation", "computer_use_preview": "computer",
           "computer": "computer", "computer_use": "computer", "shell": "shell",
           "apply_patch": "apply_patch"}
_INCLUDE_SOURCES = ("web_search_call.action.sources", "web_search_call.results")


# ------------------------------------------------------------------------------------------
# Request validation
# ------------------------------------------------------------------------------------------

def _str_list(v: Any, p: str, max_len: int, min_len: int = 0) -> list[str]:
    if not isinstance(v, list):
        raise E.invalid_type.at(p, expected="an array of strings")
    if len(v) > max_len:
        raise E.array_too_long.at(p, max_len=max_len, length=len(v))
    if len(v) < min_len:
        raise E.empty_array.at(p, min_len=min_len)
    for i, s in enumerate(v):
        if not isinstance(s, str):
            raise E.invalid_type_got.at(f"{p}[{i}]", expected="a string", got=got(s))
    return v


def _choice(t: Item, key: str, p: str, allowed: tuple[str, ...]) -> None:
    v = t.get(key)
    if v is not None and v not in allowed:
        raise E.invalid_value.at(f"{p}.{key}", value=v, allowed=quoted(allowed))


def _int(t: Item, key: str, p: str, lo: int, hi: int) -> None:
    v = t.get(key)
    if v is None:
        return
    if type(v) is not int:
        raise E.invalid_type.at(f"{p}.{key}", expected="an integer")
    if not lo <= v <= hi:
        raise E.out_of_range.at(f"{p}.{key}", lo=lo, hi=hi, value=v)


def mcp_allowed(t: Item) -> list[str] | None:
    """The names an mcp tool's ``allowed_tools`` allows (None: all)."""
    a = t.get("allowed_tools")
    if isinstance(a, dict):
        a = a.get("tool_names")
    return a if isinstance(a, list) else None


def check_tools(tools: list[Item]) -> None:
    """The hosted tools' own fields and bounds (each a 400 naming the field)."""
    labels: set[str] = set()
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        fam = FAMILY.get(t["type"])
        if fam == "web_search":
            _choice(t, "search_context_size", p, ("low", "medium", "high"))
            loc = t.get("user_location")
            if loc is not None and not isinstance(loc, dict):
                raise E.invalid_type.at(f"{p}.user_location", expected="an object")
            f = t.get("filters")
            if isinstance(f, dict) and f.get("allowed_domains") is not None:
                _str_list(f["allowed_domains"], f"{p}.filters.allowed_domains", MAX_DOMAINS)
        elif fam == "file_search":
            _str_list(t["vector_store_ids"], f"{p}.vector_store_ids", MAX_VECTOR_STORES, 1)
            _int(t, "max_num_results", p, 1, 50)
        elif fam == "code_interpreter":
            c = t["container"]
            if isinstance(c, dict):
                if c.get("type") != "auto":
                    raise E.invalid_value.at(f"{p}.container.type", value=c.get("type"),
                                             allowed="'auto'")
                if c.get("file_ids") is not None:
                    _str_list(c["file_ids"], f"{p}.container.file_ids", MAX_VECTOR_STORES * 4)
            elif not isinstance(c, str):
                raise E.invalid_type.at(f"{p}.container", expected="a string or an object")
        elif fam == "image_generation":
            _int(t, "partial_images", p, 0, 3)
            _choice(t, "output_format", p, ("png", "webp", "jpeg"))
            _choice(t, "quality", p, ("low", "medium", "high", "auto"))
            _choice(t, "background", p, ("transparent", "opaque", "auto"))
        elif fam == "computer" and t["type"] == "computer_use_preview":
            _int(t, "display_width", p, 1, 10_000)
            _int(t, "display_height", p, 1, 10_000)
        elif fam == "mcp":
            label = t["server_label"]
            if not isinstance(label, str) or not label:
                raise E.invalid_type.at(f"{p}.server_label", expected="a non-empty string")
            if label in labels:
                raise E.invalid_value.at(f"{p}.server_label", value=label,
                                         allowed="a label not used by another mcp tool")
            labels.add(label)
            a = t.get("allowed_tools")
            if a is not None:
                names = a.get("tool_names", []) if isinstance(a, dict) else a
                _str_list(names, f"{p}.allowed_tools", MAX_ALLOWED_TOOLS)
            ra = t.get("require_approval")
            if isinstance(ra, str):
                _choice(t, "require_approval", p, ("always", "never"))
            elif ra is not None and not isinstance(ra, dict):
                raise E.invalid_type.at(f"{p}.require_approval",
                                        expected="'always', 'never' or an object")
    if len(labels) > MAX_MCP_SERVERS:
        raise E.too_many_mcp_servers.at("tools", max=MAX_MCP_SERVERS, count=len(labels))


def _name(t: Item) -> str:
    fam = FAMILY[t["type"]]
    return f"mcp:{t['server_label']}" if fam == "mcp" else fam


def decide_tools(tools: list[Item]) -> list[Tool]:
    """The hosted tools as the decision's tools (custom-kind: its free-form input is the
    query the model writes, billed as its tokens)."""
    out = []
    for t in tools:
        fam = FAMILY.get(t["type"])
        if fam is None:
            continue
        if fam == "mcp":
            label = t["server_label"]
            names = mcp_allowed(t) or [x["name"] for x in sim.mcp_tools(label)]
            desc = " ".join([str(t.get("server_description") or ""), label, *names])
        else:
            desc = _FOR[fam]
        out.append(Tool(_name(t), "custom", description=desc))
    return out


def forced(tc: Any, tools: list[Item]) -> ToolChoice | None:
    """A ``tool_choice`` that forces a hosted tool of ``tools``, as the decision reads it."""
    if not isinstance(tc, dict):
        return None
    if tc.get("type") == "mcp":
        return ToolChoice("named", frozenset((f"mcp:{tc.get('server_label')}",)))
    fam = _CHOICE.get(tc.get("type", ""))
    if fam is None or not any(FAMILY.get(t["type"]) == fam for t in tools):
        return None
    return ToolChoice("named", frozenset((fam,)))


# ------------------------------------------------------------------------------------------
# Input items: hosted calls replayed, client tools' outputs, approvals
# ------------------------------------------------------------------------------------------

INPUT_TYPES: dict[str, tuple[str, ...]] = {
    "web_search_call": ("action", "status"), "file_search_call": ("queries", "status"),
    "code_interpreter_call": ("container_id", "status"),
    "image_generation_call": ("status",), "mcp_list_tools": ("server_label", "tools"),
    "mcp_call": ("arguments", "name", "server_label"),
    "mcp_approval_request": ("arguments", "name", "server_label"),
    "mcp_approval_response": ("approval_request_id", "approve"),
    "computer_call": ("call_id", "status"), "computer_call_output": ("call_id", "output"),
    "shell_call": ("action", "call_id"), "shell_call_output": ("call_id", "output"),
    "local_shell_call": ("action", "call_id", "status"),
    "local_shell_call_output": ("output",),
    "apply_patch_call": ("call_id", "operation", "status"),
    "apply_patch_call_output": ("call_id", "status")}
PREFIX = {"web_search_call": "ws_", "file_search_call": "fs_", "code_interpreter_call": "ci_",
          "image_generation_call": "ig_", "mcp_list_tools": "mcpl_", "mcp_call": "mcp_",
          "mcp_approval_request": "mcpr_", "mcp_approval_response": "mcpa_",
          "computer_call": "cu_", "computer_call_output": "cuo_", "shell_call": "sh_",
          "shell_call_output": "sho_", "local_shell_call": "lsh_",
          "local_shell_call_output": "lsho_", "apply_patch_call": "apc_",
          "apply_patch_call_output": "apco_"}
CALL_OF_OUTPUT = {"computer_call_output": "computer_call", "shell_call_output": "shell_call",
                  "apply_patch_call_output": "apply_patch_call"}


def input_item(it: Item, t: str, p: str) -> Item:
    """A hosted-tool item given as input, checked for its required fields and kept as
    given (with an id when it has none)."""
    for key in INPUT_TYPES[t]:
        if it.get(key) is None:
            raise missing(f"{p}.{key}")
    for key in ("call_id", "approval_request_id", "server_label", "name"):
        v = it.get(key)
        if v is not None and not isinstance(v, str):
            raise E.invalid_type_got.at(f"{p}.{key}", expected="a string", got=got(v))
    if t == "mcp_approval_response" and not isinstance(it["approve"], bool):
        raise E.invalid_type.at(f"{p}.approve", expected="a boolean")
    out = dict(it)
    if not isinstance(out.get("id"), str):
        out["id"] = new_id(PREFIX[t])
    return out


def check_approvals(items: list[Item], history: list[Item]) -> None:
    """Every ``mcp_approval_response`` answers an approval request of the context; one input
    answers at most :data:`MAX_PENDING_APPROVALS`."""
    answers = [(i, it) for i, it in enumerate(items) if it.get("type") == "mcp_approval_response"]
    if not answers:
        return
    if len(answers) > MAX_PENDING_APPROVALS:
        raise E.too_many_approvals.at("input", max=MAX_PENDING_APPROVALS, count=len(answers))
    asked = {it.get("id") for it in (*history, *items)
             if it.get("type") == "mcp_approval_request"}
    for i, it in answers:
        if it["approval_request_id"] not in asked:
            raise E.mcp_approval_unknown.at(f"input[{i}].approval_request_id",
                                            id=it["approval_request_id"])


# ------------------------------------------------------------------------------------------
# The output
# ------------------------------------------------------------------------------------------

def _script(call_args: str) -> dict[str, Any]:
    """A scripted hosted call's arguments (a JSON object), else nothing (the model's own
    query text)."""
    if not call_args.startswith("{"):
        return {}
    try:
        v = orjson.loads(call_args)
    except orjson.JSONDecodeError:
        return {}
    return v if isinstance(v, dict) else {}


class _Run:
    """One response's hosted work: the items, the time, the tokens and what was found."""

    def __init__(self, rr: RespRequest, lat: Latency, rng: random.Random, enc: str,
                 user_text: str) -> None:
        self.rr = rr
        self.lat = lat
        self.rng = rng
        self.enc = enc
        self.user_text = user_text
        self.items: list[ReasoningOut | MessageOut | CallOut | HostedOut] = []
        self.output_tokens = 0  # hosted items the model writes (code, MCP arguments)
        self.result_tokens = 0  # what the tools found: input of the answer that follows
        self.server_ran = False  # a server-run tool ran: the model answers after it
        self.waits_client = False  # a call the client runs (or approves): the response ends
        self.cites: list[dict[str, Any]] = []  # (url or file) citations for the message
        self.searches = 0
        self.image_tokens = 0

    def secs(self, kind: str) -> float:
        return sim.seconds(self.lat, self.rng, kind)

    def query(self, script: dict[str, Any]) -> str:
        q = script.get("query")
        return q if isinstance(q, str) and q else sim.query_of(self.user_text, self.rng)

    def add(self, item: HostedOut) -> None:
        self.items.append(item)

    # -- server-run tools ------------------------------------------------------------------
    def web_search(self, tool: Item, script: dict[str, Any]) -> None:
        q = self.query(script)
        n = {"low": 2, "medium": 3, "high": 5}.get(tool.get("search_context_size", "medium"), 3)
        given = script.get("sources")
        if isinstance(given, list) and given:
            sources = [{"url": str(s.get("url")), "title": str(s.get("title") or s.get("url"))}
                       for s in given[:20] if isinstance(s, dict) and s.get("url")]
        else:
            sources = sim.web_sources(q, self.rng, n)
        include = any(x in self.rr.include for x in _INCLUDE_SOURCES)
        action: dict[str, Any] = {"type": "search", "query": q, "queries": [q]}
        if include:
            action["sources"] = [{"type": "url", "url": s["url"]} for s in sources]
        iid = new_id("ws_")
        self.add(HostedOut(iid, {"id": iid, "type": "web_search_call", "status": "in_progress",
                                 "action": {"type": "search", "query": q}},
                           {"id": iid, "type": "web_search_call", "status": "completed",
                            "action": action},
                           [(0.0, "response.web_search_call.in_progress", {}),
                            (0.0, "response.web_search_call.searching", {}),
                            (self.secs("web_search"), "response.web_search_call.completed",
                             {})]))
        self.searches += 1
        if tool.get("search_context_size") == "high" and sources:
            # a deeper search opens the best page and looks for the query in it
            url = sources[0]["url"]
            for action2, kind in (({"type": "open_page", "url": url}, "open_page"),
                                  ({"type": "find_in_page", "url": url, "pattern": q},
                                   "open_page")):
                iid = new_id("ws_")
                self.add(HostedOut(iid, {"id": iid, "type": "web_search_call",
                                         "status": "in_progress", "action": action2},
                                   {"id": iid, "type": "web_search_call",
                                    "status": "completed", "action": action2},
                                   [(0.0, "response.web_search_call.in_progress", {}),
                                    (0.0, "response.web_search_call.searching", {}),
                                    (self.secs(kind), "response.web_search_call.completed",
                                     {})]))
        self.result_tokens += count_json(sources, self.enc)
        self.cites += [{"type": "url_citation", **s} for s in sources]
        self.server_ran = True

    def file_search(self, tool: Item, script: dict[str, Any]) -> None:
        q = self.query(script)
        n = min(int(tool.get("max_num_results") or 10), 3 + self.rng.randrange(3))
        given = script.get("results")
        if isinstance(given, list) and given:
            results = [{"file_id": str(r.get("file_id") or "file-scripted"),
                        "filename": str(r.get("filename") or "document.pdf"),
                        "score": float(r.get("score") or 0.9), "text": str(r.get("text") or ""),
                        "attributes": r.get("attributes") or {}}
                       for r in given[:50] if isinstance(r, dict)]
        else:
            results = sim.file_results(q, tool["vector_store_ids"], self.rng, n)
        iid = new_id("fs_")
        include = "file_search_call.results" in self.rr.include
        self.add(HostedOut(iid, {"id": iid, "type": "file_search_call", "status": "in_progress",
                                 "queries": [], "results": None},
                           {"id": iid, "type": "file_search_call", "status": "completed",
                            "queries": [q], "results": results if include else None},
                           [(0.0, "response.file_search_call.in_progress", {}),
                            (0.0, "response.file_search_call.searching", {}),
                            (self.secs("file_search"), "response.file_search_call.completed",
                             {})]))
        self.result_tokens += sum(tok.count_tokens(str(r["text"]), self.enc) for r in results)
        seen = set()
        for r in results:  # one citation a file
            if r["file_id"] not in seen:
                seen.add(r["file_id"])
                self.cites.append({"type": "file_citation", "file_id": r["file_id"],
                                   "filename": r["filename"]})
        self.server_ran = True

    def code_interpreter(self, tool: Item, script: dict[str, Any]) -> None:
        code, logs = sim.program(self.rng)
        if isinstance(script.get("code"), str):
            code = script["code"]
            logs = str(script.get("logs", ""))
        c = tool["container"]
        container = c if isinstance(c, str) else "cntr_" + new_id("", 32)
        pieces, n = tok.split_pieces_counted(code, self.enc)
        gap = self.lat.mean_gap()
        iid = new_id("ci_")
        steps: list[tuple[float, str, dict[str, Any]]] = [
            (0.0, "response.code_interpreter_call.in_progress", {})]
        steps += [(gap if i else 0.0, "response.code_interpreter_call_code.delta",
                   {"delta": piece}) for i, piece in enumerate(pieces)]
        steps += [(0.0, "response.code_interpreter_call_code.done", {"code": code}),
                  (0.0, "response.code_interpreter_call.interpreting", {}),
                  (self.secs("code_interpreter"), "response.code_interpreter_call.completed",
                   {})]
        include = "code_interpreter_call.outputs" in self.rr.include
        self.add(HostedOut(iid, {"id": iid, "type": "code_interpreter_call",
                                 "status": "in_progress", "code": "", "container_id": container,
                                 "outputs": None},
                           {"id": iid, "type": "code_interpreter_call", "status": "completed",
                            "code": code, "container_id": container,
                            "outputs": [{"type": "logs", "logs": logs}] if include else None},
                           steps))
        self.output_tokens += n
        self.result_tokens += tok.count_tokens(logs, self.enc)
        self.server_ran = True

    def image_generation(self, tool: Item, script: dict[str, Any]) -> None:
        prompt = script.get("prompt") if isinstance(script.get("prompt"), str) else \
            self.query(script)
        total = self.secs("image_generation")
        partial = int(tool.get("partial_images") or 0)
        size = str(tool.get("size") or "1024x1024")
        quality = str(tool.get("quality") or "auto")
        background = str(tool.get("background") or "auto")
        iid = new_id("ig_")
        steps: list[tuple[float, str, dict[str, Any]]] = [
            (0.0, "response.image_generation_call.in_progress", {}),
            (0.0, "response.image_generation_call.generating", {})]
        for k in range(partial):
            steps.append((total / (partial + 1), "response.image_generation_call.partial_image",
                          {"partial_image_index": k, "partial_image_b64": base64.b64encode(
                              sim.png(derive(self.rng, f"partial{k}"), 16)).decode(),
                           "size": size, "quality": quality, "background": background,
                           "output_format": "png"}))
        steps.append((total / (partial + 1), "response.image_generation_call.completed", {}))
        result = base64.b64encode(sim.png(self.rng)).decode()
        self.add(HostedOut(iid, {"id": iid, "type": "image_generation_call",
                                 "status": "in_progress", "result": None},
                           {"id": iid, "type": "image_generation_call", "status": "completed",
                            "result": result, "revised_prompt": prompt, "size": size,
                            "quality": quality, "background": background,
                            "output_format": "png"}, steps))
        self.image_tokens += {"low": 272, "medium": 1056, "high": 4160}.get(quality, 1056)
        self.server_ran = True

    # -- MCP ---------------------------------------------------------------------------------
    def mcp_list(self, tool: Item, scripted: list[Any] | None = None) -> None:
        label = tool["server_label"]
        iid = new_id("mcpl_")
        tools = _scripted_tools(scripted) if scripted else \
            sim.mcp_tools(label, mcp_allowed(tool))
        self.add(HostedOut(iid, {"id": iid, "type": "mcp_list_tools", "server_label": label,
                                 "tools": []},
                           {"id": iid, "type": "mcp_list_tools", "server_label": label,
                            "tools": tools},
                           [(0.0, "response.mcp_list_tools.in_progress", {}),
                            (self.secs("mcp_list_tools"), "response.mcp_list_tools.completed",
                             {})]))

    def mcp(self, tool: Item, script: dict[str, Any]) -> None:
        label = tool["server_label"]
        names = mcp_allowed(tool) or [x["name"] for x in sim.mcp_tools(label)]
        given = script.get("name")
        name = given if isinstance(given, str) else names[self.rng.randrange(len(names))]
        args = script.get("arguments")
        arguments = orjson.dumps(args).decode() if isinstance(args, dict) else \
            sim.mcp_arguments(self.query(script))
        if _needs_approval(tool, name) and not script.get("approved"):
            iid = new_id("mcpr_")
            item = {"id": iid, "type": "mcp_approval_request", "server_label": label,
                    "name": name, "arguments": arguments}
            self.add(HostedOut(iid, item, item))
            self.waits_client = True
            return
        self.mcp_call(label, name, arguments, None, script)

    def mcp_call(self, label: str, name: str, arguments: str, approval: str | None,
                 script: dict[str, Any]) -> None:
        out = script.get("output")
        err = script.get("error")
        output = out if isinstance(out, str) else (
            None if err else sim.mcp_output(name, _query_in(arguments), self.rng))
        pieces, n = tok.split_pieces_counted(arguments, self.enc)
        gap = self.lat.mean_gap()
        iid = new_id("mcp_")
        base = {"id": iid, "type": "mcp_call", "server_label": label, "name": name,
                "approval_request_id": approval}
        steps: list[tuple[float, str, dict[str, Any]]] = [
            (0.0, "response.mcp_call.in_progress", {})]
        steps += [(gap if i else 0.0, "response.mcp_call_arguments.delta", {"delta": piece})
                  for i, piece in enumerate(pieces)]
        steps += [(0.0, "response.mcp_call_arguments.done", {"arguments": arguments}),
                  (self.secs("mcp_call"), "response.mcp_call.failed" if err
                   else "response.mcp_call.completed", {})]
        done = {**base, "arguments": arguments, "output": output,
                "error": {"type": "mcp_tool_execution_error",
                          "content": [{"type": "text", "text": str(err)}]} if err else None,
                "status": "failed" if err else "completed"}
        self.add(HostedOut(iid, {**base, "arguments": "", "status": "in_progress"}, done,
                           steps))
        self.output_tokens += n
        self.result_tokens += tok.count_tokens(output or "", self.enc)
        self.server_ran = True

    # -- client-run tools --------------------------------------------------------------------
    def client(self, tool: Item, fam: str, script: dict[str, Any], context: list[Item]) -> None:
        call_id = new_id("call_")
        q = self.query(script)
        fields: dict[str, Any]
        steps: list[tuple[float, str, dict[str, Any]]] = []
        if fam == "computer":
            first = not any(it.get("type") == "computer_call" for it in context)
            action = script.get("action") if isinstance(script.get("action"), dict) else \
                sim.computer_action(self.rng, first, int(tool.get("display_width") or 1024),
                                    int(tool.get("display_height") or 768))
            iid, fields = new_id("cu_"), {"type": "computer_call", "call_id": call_id,
                                          "action": action, "pending_safety_checks": []}
        elif fam == "shell":
            given = script.get("commands")
            cmds: list[Any] = given[:64] if isinstance(given, list) else \
                sim.shell_commands(q, self.rng)
            iid, fields = new_id("sh_"), {"type": "shell_call", "call_id": call_id, "action": {
                "commands": cmds, "timeout_ms": None, "max_output_length": None}}
            # each command streams as the model writes it
            gap = self.lat.mean_gap()
            for ci, cmd in enumerate(cmds):
                pieces, n = tok.split_pieces_counted(str(cmd), self.enc)
                steps.append((0.0, "response.shell_call_command.added",
                              {"command_index": ci, "command": ""}))
                steps += [(gap if k else 0.0, "response.shell_call_command.delta",
                           {"command_index": ci, "delta": piece})
                          for k, piece in enumerate(pieces)]
                steps.append((0.0, "response.shell_call_command.done",
                              {"command_index": ci, "command": str(cmd)}))
                self.output_tokens += n
        elif fam == "local_shell":
            cmd = script.get("command") if isinstance(script.get("command"), list) else \
                sim.shell_commands(q, self.rng)[0].split()
            iid, fields = new_id("lsh_"), {"type": "local_shell_call", "call_id": call_id,
                                           "action": {"type": "exec", "command": cmd,
                                                      "env": {}}}
        else:  # apply_patch
            op = script.get("operation") if isinstance(script.get("operation"), dict) else \
                sim.patch(q, self.rng)
            iid, fields = new_id("apc_"), {"type": "apply_patch_call", "call_id": call_id,
                                           "operation": op}
        self.add(HostedOut(iid, {"id": iid, **fields, "status": "in_progress"},
                           {"id": iid, **fields, "status": "completed"}, steps))
        self.waits_client = True


MAX_SCRIPTED_TOOLS = 64


def _scripted_tools(given: list[Any]) -> list[dict[str, Any]]:
    """An MCP server's tools as a script lists them: names, or objects with a ``name`` (and
    ``description``, ``input_schema``)."""
    out = []
    for t in given[:MAX_SCRIPTED_TOOLS]:
        if isinstance(t, str):
            t = {"name": t}
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            out.append({"name": t["name"], "description": t.get("description"),
                        "input_schema": t.get("input_schema") or sim.QUERY_SCHEMA,
                        "annotations": t.get("annotations")})
    return out


def _query_in(arguments: str) -> str:
    try:
        v = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments[:80]
    return str(v.get("query", "")) if isinstance(v, dict) else arguments[:80]


def _needs_approval(tool: Item, name: str) -> bool:
    ra = tool.get("require_approval", "always")
    if ra == "never":
        return False
    if isinstance(ra, dict):
        never = ra.get("never")
        if isinstance(never, dict) and name in (never.get("tool_names") or ()):
            return False
        always = ra.get("always")
        if isinstance(always, dict):
            return name in (always.get("tool_names") or ())
        return never is None
    return True


def _listed(context: list[Item]) -> set[str]:
    return {it.get("server_label", "") for it in context if it.get("type") == "mcp_list_tools"}


def _approved(items: list[Item], context: list[Item]) -> list[Item]:
    """The approval requests this input approves (that no call has answered yet)."""
    yes = {it["approval_request_id"] for it in items
           if it.get("type") == "mcp_approval_response" and it.get("approve") is True}
    if not yes:
        return []
    ran = {it.get("approval_request_id") for it in context if it.get("type") == "mcp_call"}
    return [it for it in context if it.get("type") == "mcp_approval_request"
            and it.get("id") in yes and it.get("id") not in ran]


def involved(rr: RespRequest) -> bool:
    """Does this request have hosted tools (the output goes through :func:`response_out`)?"""
    tools = rr.tools
    return bool(tools) and any(t["type"] in FAMILY for t in tools)  # (most have none)


def _cite(pieces: list[str], cites: list[dict[str, Any]], enc: str,
          lps: list[dict[str, Any]] | None
          ) -> tuple[list[str], list[dict[str, Any]], int, list[dict[str, Any]] | None]:
    """The message's pieces with up to three citations, at the ends of equal stretches of
    the text: a web page as a markdown link that its ``url_citation`` spans, a file at its
    ``file_citation`` index. Returns the pieces, the annotations, the tokens added and the
    logprobs (one for each piece: the inserted ones certain)."""
    if not cites or not pieces:
        return pieces, [], 0, lps
    k = min(len(cites), 3)
    cuts = sorted({max(1, len(pieces) * (j + 1) // k) for j in range(k)})
    out: list[str] = []
    out_lps: list[dict[str, Any]] | None = [] if lps is not None else None
    anns: list[dict[str, Any]] = []
    added = 0
    at = 0  # characters so far
    prev = 0
    for j, cut in enumerate(cuts):
        for i in range(prev, cut):
            out.append(pieces[i])
            at += len(pieces[i])
            if out_lps is not None and lps is not None:
                out_lps.append(lps[i])
        prev = cut
        c = cites[j]
        if c["type"] == "url_citation":
            domain = c["url"].split("/")[2] if c["url"].count("/") >= 2 else c["url"]
            link = f"[{domain}]({c['url']})"
            extra, n = tok.split_pieces_counted(f" ({link})", enc)
            start = at + 2  # after " ("
            anns.append({"type": "url_citation", "start_index": start,
                         "end_index": start + len(link), "title": c["title"], "url": c["url"]})
            out += extra
            if out_lps is not None:
                out_lps += [{"token": x, "logprob": 0.0, "bytes": list(x.encode()),
                             "top_logprobs": []} for x in extra]
            at += sum(map(len, extra))
            added += n
        else:
            anns.append({"type": "file_citation", "file_id": c["file_id"],
                         "filename": c["filename"], "index": at})
    out += pieces[prev:]
    if out_lps is not None and lps is not None:
        out_lps += lps[prev:]
    return out, anns, added, out_lps


def response_out(d: Decision, asked: Ask, rr: RespRequest, context: list[Item],
                 input_items: list[Item], cfg: Config, rng: random.Random, lat: Latency,
                 rid: str, created_at: int) -> RespOut:
    """The decision as Responses output when the request has hosted tools: the hosted items
    (MCP listings first, approved calls, then each call in the decision's order), then the
    model's answer after the tools that the server ran (a second decision over their
    results), or the end of the turn when a call waits for the client."""
    c = d.choices[0]
    enc = rr.profile.encoding
    by_name = {_name(t): t for t in rr.tools if t["type"] in FAMILY}
    customs = {t["name"] for t in rr.tools if t["type"] == "custom"}
    hrng = derive(rng, "hosted")
    run = _Run(rr, lat, hrng, enc, asked.user_text())
    streamed = 0
    if c.reasoning is not None:
        r = c.reasoning
        run.items.append(ReasoningOut(new_id("rs_"), r.tokens, r.summary, r.encrypted))
        streamed += sum(map(len, r.summary))
    listed = _listed(context)
    scripted: dict[str, list[Any]] = {}  # a scripted MCP call may give its server's tools
    for call in c.calls:
        if call.name.startswith("mcp:"):
            given = _script(call.arguments).get("tools")
            if isinstance(given, list):
                scripted[call.name[4:]] = given
    for t in rr.tools:
        if t["type"] == "mcp" and t["server_label"] not in listed:
            run.mcp_list(t, scripted.get(t["server_label"]))
    for req_item in _approved(input_items, context):
        run.mcp_call(req_item["server_label"], req_item["name"], req_item["arguments"],
                     req_item["id"], {})
    calls_out = 0
    for call in c.calls:
        tool = by_name.get(call.name) if call.name not in customs else None
        if tool is None:
            fn = call.kind == "function"
            run.items.append(CallOut(new_id("fc_" if fn else "ctc_"), call.call_id, call.name,
                                     call.arguments, call.pieces, call.tokens,
                                     "function_call" if fn else "custom_tool_call",
                                     "completed" if call.complete else "incomplete"))
            streamed += len(call.pieces)
            calls_out += 1
            continue
        fam = FAMILY[tool["type"]]
        script = _script(call.arguments)
        if fam in CLIENT_RUN:
            run.client(tool, fam, script, context)
        else:
            getattr(run, fam)(tool, script)
    usage = d.usage
    prompt, output = usage.prompt_tokens, usage.output_tokens + run.output_tokens
    reasoning = usage.reasoning_tokens
    reason = INCOMPLETE.get(c.finish) if c.pieces is not None else None
    if c.pieces is not None:  # the model answered in text (an MCP listing at most before)
        pieces, anns, added, lps = _cite(c.pieces, run.cites, enc, c.logprobs)
        run.items.append(MessageOut(new_id("msg_"), pieces, c.tokens + added,
                                    "completed" if reason is None else "incomplete",
                                    lps, anns or None))
        streamed += len(pieces)
        output += added
    elif run.server_ran and not run.waits_client and not calls_out:
        # the tools' results are in: the model reads them and answers
        ask2 = replace(asked, tools=(), tool_choice=AUTO, after_tool_result=True, effort=None,
                       prompt_tokens=asked.prompt_tokens + run.result_tokens,
                       limit=None if asked.limit is None else max(1, asked.limit - output))
        d2 = decide(ask2, cfg, derive(rng, "answer"), lat)
        c2 = d2.choices[0]
        reason = INCOMPLETE.get(c2.finish)
        cites = run.cites if reason is None else []
        pieces, anns, added, lps = _cite(c2.pieces or [], cites, enc, c2.logprobs)
        run.items.append(MessageOut(new_id("msg_"), pieces, c2.tokens + added,
                                    "completed" if reason is None else "incomplete",
                                    lps, anns or None))
        streamed += len(pieces)
        prompt += d2.usage.prompt_tokens
        output += d2.usage.output_tokens + added
    elif c.finish == "length":
        reason = INCOMPLETE["length"]
    out = RespOut(rid, created_at, Usage(prompt, output, reasoning, usage.cached_tokens),
                  run.items, "completed" if reason is None else "incomplete", reason, d.timing,
                  streamed)
    out.extra = sum(i.seconds for i in run.items if type(i) is HostedOut)
    if run.searches or run.image_tokens or any(
            FAMILY.get(t["type"]) in ("web_search", "image_generation") for t in rr.tools):
        out.tool_usage = {"web_search": {"num_requests": run.searches},
                          "image_gen": {"input_tokens": 0, "input_tokens_details": {
                              "image_tokens": 0, "text_tokens": 0},
                              "output_tokens": run.image_tokens,
                              "total_tokens": run.image_tokens}}
    return out

