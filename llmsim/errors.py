"""API errors and the OpenAI error envelope, decided in one place.

Every error llmsim answers is an entry of the catalogue :class:`E`: its status, type, code,
message template (named fields) and whether it names a parameter. A call site builds the
error with ``E.entry.at(param, field=value, ...)`` and raises it; the error travels as an
:class:`APIError` object to the edge (HTTP status line + envelope, SSE error event or
WebSocket error), where :meth:`APIError.body` / :meth:`APIError.to_dict` render it. Values a
client sent reach a message only through :func:`bounded` (``Entry.clip`` names those fields,
and the parameter name is always bounded), so no answer echoes megabytes back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

__all__ = ["APIError", "E", "Entry", "bounded", "quoted", "missing",
           "not_found_model", "envelope", "server_error", "scripted", "SERVER_ERROR_MESSAGE",
           "RATE_LIMIT_URL", "MAX_ECHO"]

_STATUS_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "timeout_error",
    529: "server_error",
}


class APIError(Exception):
    """An error returned to the client as ``{"error": {message, type, param, code}}``.

    Before the first byte of a response it becomes a status line plus this envelope; after
    the first byte the transport turns it into the stream's error event instead. Build one
    from the catalogue (:class:`E`), not by hand.
    """

    __slots__ = ("status", "message", "type", "param", "code", "headers", "overloaded")

    def __init__(self, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: list[tuple[str, str]] | None = None,
                 overloaded: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _STATUS_TYPE.get(status, "invalid_request_error" if status < 500
                                             else "server_error")
        self.param = param
        self.code = code
        self.headers = headers or []
        # the engine refused for capacity (not rendered by OpenAI; Anthropic answers 529)
        self.overloaded = overloaded

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "type": self.type, "param": self.param,
                "code": self.code}

    def body(self) -> bytes:
        return envelope(self.message, self.type, self.param, self.code)

    def copy(self) -> APIError:
        """A fresh error with the same answer (an error kept to be raised again, e.g. a
        scripted turn's, is copied so each raise has its own traceback and header list)."""
        return APIError(self.status, self.message, type=self.type, param=self.param,
                        code=self.code, headers=list(self.headers), overloaded=self.overloaded)

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, code={self.code!r})"


def envelope(message: str, type: str, param: str | None, code: str | None) -> bytes:
    """The OpenAI error body."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param,
                                   "code": code}})


MAX_ECHO = 256
"""Characters of one client-supplied value an error message may repeat (then an ellipsis)."""


def bounded(value: object, limit: int = MAX_ECHO) -> str:
    """``value`` as text, cut to ``limit`` characters with an ellipsis: the one way a value
    a client sent (a key, an enum value, an id) is pasted into an error message."""
    s = value if type(value) is str else str(value)
    return s if len(s) <= limit else s[:limit] + "..."


def quoted(choices: Iterable[object]) -> str:
    """The real API's list of supported values: ``'a'``, ``'a' and 'b'``,
    ``'a', 'b', and 'c'``."""
    items = [f"'{c}'" for c in choices]
    if len(items) < 3:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


@dataclass(frozen=True, slots=True)
class Entry:
    """One error of the catalogue: what the client sees, with the variable parts named.

    ``template`` is a :meth:`str.format` string over the fields given to :meth:`at` (plus
    ``param`` and ``status``); ``clip`` names the fields that carry client-supplied values
    (bounded to :data:`MAX_ECHO` characters); ``names_param`` says whether the answer's
    ``param`` is set. ``type`` None: the type that goes with the status (``_STATUS_TYPE``)."""

    status: int
    code: str | None
    template: str
    type: str | None = None
    names_param: bool = True
    clip: tuple[str, ...] = ()
    overloaded: bool = False

    def at(self, param: str | None = None, /, *, status: int | None = None,
           type: str | None = None, code: str | None = None,
           headers: list[tuple[str, str]] | None = None, **fields: Any) -> APIError:
        """The error for ``param`` with the template's ``fields`` filled in (``status``,
        ``type`` and ``code`` override the entry's for the few errors whose status or code
        the caller's configuration or context decides)."""
        if param is not None:
            param = bounded(param)
        for name in self.clip:
            fields[name] = bounded(fields[name])
        status = status or self.status
        return APIError(status, self.template.format(param=param, status=status, **fields),
                        type=type or self.type, param=param if self.names_param else None,
                        code=code or self.code, headers=headers, overloaded=self.overloaded)


SERVER_ERROR_MESSAGE = ("The server had an error while processing your request. Sorry about "
                        "that!")
"""The real API's wording of a 5xx on its side (written once: every 500-ish answer uses it)."""

RATE_LIMIT_URL = "Visit https://platform.openai.com/account/rate-limits to learn more."

_JSON_HINT = ("We could not parse the JSON body of your request. (HINT: This likely means you "
              "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
              "but what was sent was not valid JSON.")
_CONTEXT = "This model's maximum context length is {window} tokens"
_OVERLOADED = "The server is currently overloaded, please try again later."
_ADMIN_INVALID = ("Incorrect {name} provided: {key}. Changes under /llmsim/ (fault rules, stats "
                  "reset) require one of the {flag} keys.")
_INJECTED = "Injected fault: HTTP {status}."


class E:
    """The catalogue: every error llmsim answers, once. Wording checked against the real API
    where it has the error; llmsim's own errors (simulator bounds, admin, faults, cassettes,
    WebSocket handshake) say what to change."""

    # --- request body and HTTP ----------------------------------------------------------
    empty_body = Entry(400, None, _JSON_HINT + " If you have trouble figuring out how to fix "
                       "this, please contact us through our help center at help.openai.com.)",
                       names_param=False)
    invalid_json = Entry(400, None, _JSON_HINT + ")", names_param=False)
    body_not_object = Entry(400, "invalid_type", "The request body must be a JSON object.",
                            names_param=False)
    nested_too_deep = Entry(400, "nesting_above_max_depth", "Invalid {where}: nested too "
                            "deeply. Objects and arrays may nest at most {depth} levels.")
    multipart_invalid = Entry(400, "invalid_multipart", "Invalid multipart/form-data body: "
                              "{reason}.", names_param=False)
    multipart_too_many_parts = Entry(400, "invalid_multipart", "Invalid multipart/form-data "
                                     "body: more than {max} parts.", names_param=False)
    file_not_found = Entry(404, "not_found", "No such file: '{name}' (expired or never "
                           "generated).", names_param=False, clip=("name",))
    image_n_one = Entry(400, "invalid_value", "You must provide n=1 for this model.")
    image_invalid_file = Entry(400, "invalid_image_format", "Invalid '{param}': expected a "
                               "{formats} file.")
    image_too_large = Entry(400, "image_too_large", "Invalid '{param}': the image is {size} "
                            "bytes; this model accepts at most {max} bytes.")
    image_not_square = Entry(400, "invalid_image", "Invalid '{param}': the image must be "
                             "square ({width}x{height}).")
    too_many_images = Entry(400, "array_above_max_length", "Invalid '{param}': at most {max} "
                            "images, got {count}.")
    partial_images_without_stream = Entry(400, "invalid_value", "Invalid 'partial_images': "
                                          "only allowed when 'stream' is true.")
    audio_too_large = Entry(413, "audio_too_large", "Invalid '{param}': {size} bytes; the "
                            "maximum file size is {max} bytes.")
    audio_invalid = Entry(400, "invalid_value", "Invalid '{param}': the audio file is empty or "
                          "could not be decoded.")
    granularities_need_verbose = Entry(400, "invalid_value", "Invalid '{param}': timestamp "
                                       "granularities require response_format 'verbose_json'.")
    body_too_large = Entry(413, "request_too_large", "Request body too large: the limit is "
                           "{limit} bytes.", type="invalid_request_error", names_param=False)
    headers_too_large = Entry(431, "request_header_fields_too_large", "Request header fields "
                              "too large: the limit is {limit} bytes.",
                              type="invalid_request_error", names_param=False)
    malformed_http = Entry(400, "bad_request", "Malformed HTTP request: {reason}.",
                           type="invalid_request_error", names_param=False, clip=("reason",))
    invalid_url = Entry(404, None, "Invalid URL ({method} {path})", type="invalid_request_error",
                        names_param=False, clip=("method", "path"))
    method_not_allowed = Entry(405, "method_not_allowed", "Invalid method for URL ({method} "
                               "{path}); allowed: {allow}", type="invalid_request_error",
                               names_param=False, clip=("method", "path"))

    # --- parameters (the real API's wording) -------------------------------------------------
    missing = Entry(400, "missing_required_parameter", "Missing required parameter: "
                    "'{param}'.")
    one_of_required = Entry(400, "missing_required_parameter", "Invalid '{param}': one of "
                            "{fields} is required.")
    invalid_type = Entry(400, "invalid_type", "Invalid type for '{param}': expected "
                         "{expected}.")
    invalid_type_got = Entry(400, "invalid_type", "Invalid type for '{param}': expected "
                             "{expected}, but got {got} instead.")
    invalid_value = Entry(400, "invalid_value", "Invalid value: '{value}'. Supported values "
                          "are: {allowed}.", clip=("value",))
    invalid_param = Entry(400, "invalid_value", "Invalid '{param}'.")
    not_a_boolean = Entry(400, "invalid_value", "Invalid value for '{param}': expected a "
                          "boolean.")
    out_of_range = Entry(400, "invalid_value", "Invalid '{param}': expected a value between "
                         "{lo} and {hi}, but got {value} instead.")
    integer_below_min = Entry(400, "integer_below_min_value", "Invalid '{param}': integer below "
                              "minimum value. Expected a value >= {lo}, but got {value} "
                              "instead.")
    integer_above_max = Entry(400, "integer_above_max_value", "Invalid '{param}': integer above "
                              "maximum value. Expected a value <= {hi}, but got {value} "
                              "instead.")
    decimal_below_min = Entry(400, "decimal_below_min_value", "Invalid '{param}': decimal below "
                              "minimum value. Expected a value >= {lo}, but got {value} "
                              "instead.")
    decimal_above_max = Entry(400, "decimal_above_max_value", "Invalid '{param}': decimal above "
                              "maximum value. Expected a value <= {hi}, but got {value} "
                              "instead.")
    string_too_long = Entry(400, "string_above_max_length", "Invalid '{param}': string too "
                            "long. Expected a string with maximum length {max_len}, but got a "
                            "string with length {length} instead.")
    metadata_key_too_long = Entry(400, "metadata_key_too_long", "Invalid '{param}': key '{key}' "
                                  "is too long. Expected a key with maximum length 64.")
    too_many_properties = Entry(400, "object_above_max_properties", "Invalid '{param}': too "
                                "many properties. Expected an object with at most {max} "
                                "properties, but got an object with {count} properties "
                                "instead.")
    empty_array = Entry(400, "empty_array", "Invalid '{param}': empty array. Expected an array "
                        "with minimum length {min_len}, but got an empty array instead.")
    array_too_short = Entry(400, "array_below_min_length", "Invalid '{param}': array too "
                            "short.")
    array_too_long = Entry(400, "array_above_max_length", "Invalid '{param}': array too long. "
                           "Expected an array with maximum length {max_len}, but got an array "
                           "with length {length} instead.")
    name_pattern = Entry(400, "invalid_value", "Invalid '{param}': string does not match "
                         "pattern. Expected a string that matches the pattern "
                         "'^[a-zA-Z0-9_-]+$'.")
    unrecognized_argument = Entry(400, None, "Unrecognized request argument supplied: {key}",
                                  names_param=False, clip=("key",))
    unknown_parameter = Entry(400, "unknown_parameter", "Unknown parameter: '{param}'.")
    mutually_exclusive = Entry(400, "mutually_exclusive_parameters", "Mutually exclusive "
                               "parameters: Ensure you are only providing one of: {names}.")
    unsupported_parameter = Entry(400, "unsupported_parameter", "Unsupported parameter: "
                                  "'{param}' is not supported with this model.{hint}")
    unsupported_default_only = Entry(400, "unsupported_value", "Unsupported value: '{param}' "
                                     "does not support {value} with this model. Only the "
                                     "default ({default}) value is supported.")
    unsupported_value = Entry(400, "unsupported_value", "Unsupported value: '{param}' does not "
                              "support '{value}' with this model. Supported values are: "
                              "{allowed}.", clip=("value",))
    unsupported_value_for_model = Entry(400, "unsupported_value", "Unsupported value: "
                                        "'{value}' is not supported with the '{model}' model. "
                                        "Supported values are: {allowed}.", clip=("value",))
    stream_options_without_stream = Entry(400, "invalid_value", "The 'stream_options' "
                                          "parameter is only allowed when 'stream' is "
                                          "enabled.")
    limit_too_large = Entry(400, "invalid_value", "{param} is too large: {limit}. This model "
                            "supports at most {max} {unit} tokens, whereas you provided "
                            "{limit}.")
    top_logprobs_without_logprobs = Entry(400, "invalid_value", "Invalid value for "
                                          "'top_logprobs': 'logprobs' must be set to true when "
                                          "'top_logprobs' is used.")
    min_tokens_too_large = Entry(400, "invalid_value", "min_tokens must be less than or equal "
                                 "to {bound}, got {value}.")

    # --- messages, tools and formats -----------------------------------------------------
    tool_message_orphan = Entry(400, None, "Invalid parameter: messages with role 'tool' must "
                                "be a response to a preceeding message with 'tool_calls'.")
    tool_calls_unanswered = Entry(400, None, "An assistant message with 'tool_calls' must be "
                                  "followed by tool messages responding to each "
                                  "'tool_call_id'. The following tool_call_ids did not have "
                                  "response messages: {ids}", clip=("ids",))
    invalid_tool_call = Entry(400, "invalid_value", "Invalid '{param}': expected an object with "
                              "'id', 'type' and 'function'.")
    tool_choice_without_tools = Entry(400, "invalid_value", "Invalid value for 'tool_choice': "
                                      "'tool_choice' is only allowed when 'tools' are "
                                      "specified.")
    tool_choice_unknown_function = Entry(400, "invalid_value", "Invalid value for "
                                         "'tool_choice': function '{name}' not found in "
                                         "'tools'.", clip=("name",))
    tool_choice_required_without_tools = Entry(400, "invalid_value", "Tool choice 'required' "
                                               "must be specified with 'tools' parameter.")
    tool_choice_not_in_tools = Entry(400, "invalid_value", "Tool choice '{name}' not found in "
                                     "'tools' parameter.", clip=("name",))
    duplicate_tool_name = Entry(400, "invalid_value", "Duplicate tool name: '{name}'.",
                                clip=("name",))
    json_word_required = Entry(400, None, "'messages' must contain the word 'json' in some "
                               "form, to use 'response_format' of type 'json_object'.")

    # --- context and size --------------------------------------------------------------------
    context_chat_completion = Entry(400, "context_length_exceeded", _CONTEXT + ". However, you "
                                    "requested {least}{total} tokens ({least}{prompt} in the "
                                    "messages, {completion} in the completion). Please reduce "
                                    "the length of the messages or completion.")
    context_chat_messages = Entry(400, "context_length_exceeded", _CONTEXT + ". However, your "
                                  "messages resulted in {least}{prompt} tokens. Please reduce "
                                  "the length of the messages.")
    context_prompt = Entry(400, "context_length_exceeded", _CONTEXT + ", however you requested "
                           "{least}{total} tokens ({least}{prompt} in your prompt; {completion} "
                           "for the completion). Please reduce your prompt; or completion "
                           "length.")
    context_tokenize = Entry(400, "context_length_exceeded", _CONTEXT + "; the prompt has at "
                             "least {count}.")
    context_window_exceeded = Entry(400, "context_length_exceeded", "Your input exceeds the "
                                    "context window of this model ({least}{total} tokens"
                                    "{asked} > {window}). Please adjust your input and try "
                                    "again.")
    request_work_too_large = Entry(400, "request_too_large", "This request asks llmsim to "
                                   "simulate {n} × {tokens} tokens{each}, above the "
                                   "simulator's per-request bound of {bound} token-units "
                                   "(choices × max tokens × (1 + top_logprobs)). Lower the "
                                   "token limit, 'n' or 'top_logprobs'.")
    conversation_item_too_large = Entry(400, "request_too_large", "This item is too large to "
                                        "keep in a conversation: about {size} bytes in memory, "
                                        "above this server's bound of {cap} bytes per "
                                        "conversation (responses.conversation_max_bytes). Send "
                                        "a smaller item.")
    invalid_schema = Entry(400, "invalid_json_schema", "Invalid schema for {label}: In "
                           "context={context}, {detail}.", clip=("context", "detail"))
    """A malformed JSON Schema; the caller's context decides the code (``at(code=...)``:
    ``invalid_function_parameters`` for a tool's parameters, ``invalid_json_schema`` for a
    response format)."""
    schema_over_bound = Entry(400, "request_too_large", "Schema for {label} is over llmsim's "
                              "work bound: In context={context}, {detail}. This is a limit of "
                              "the simulator, not of the API.", clip=("context", "detail"))
    schema_generation_bound = Entry(400, "request_too_large", "Generating a value for {where} "
                                    "needs {what}. This is a bound of the simulator, not of "
                                    "the API: simplify the schema (fewer nested or combined "
                                    "subschemas, smaller minItems/minLength/repetition counts) "
                                    "or ask for fewer choices ('n').")

    # --- legacy completions and embeddings --------------------------------------------------
    best_of_below_n = Entry(400, "invalid_value", "best_of must be greater than or equal to n, "
                            "got best_of={best_of} and n={n}.")
    best_of_stream = Entry(400, "invalid_value", "Cannot stream results with best_of greater "
                           "than 1.")
    invalid_token = Entry(400, "invalid_value", "Invalid token in '{param}': {token} is not a "
                          "token id of this model's vocabulary (0 to {top}).")
    embeddings_invalid_input = Entry(400, "invalid_value", "'$.input' is invalid. Please check "
                                     "the API reference: "
                                     "https://platform.openai.com/docs/api-reference.")
    dimensions_unsupported = Entry(400, "invalid_value", "This model does not support "
                                   "specifying dimensions.")
    max_tokens_per_request = Entry(400, "max_tokens_per_request", "Requested {total} tokens, "
                                   "max {max} tokens per request.")

    # --- models --------------------------------------------------------------------------
    model_not_found = Entry(404, "model_not_found", "The model `{model}` does not exist or you "
                            "do not have access to it.", type="invalid_request_error",
                            clip=("model",))
    model_not_found_retrieve = Entry(404, "model_not_found", "The model '{model}' does not "
                                     "exist", clip=("model",))
    model_not_supported = Entry(400, "model_not_supported", "The model '{model}' does not "
                                "support {what}.", clip=("model",))
    detokenize_unavailable = Entry(501, "not_implemented", "Detokenizing needs the exact "
                                   "tokenizer: install llmsim's 'tokens' extra (tiktoken) and "
                                   "do not use --tokenizer estimate.", type="server_error",
                                   names_param=False)

    # --- responses and conversations -----------------------------------------------------------
    response_not_found = Entry(404, None, "Response with id '{id}' not found.", clip=("id",))
    previous_response_not_found = Entry(400, "previous_response_not_found", "Previous response "
                                        "with id '{id}' not found.", clip=("id",))
    previous_response_in_progress = Entry(400, "previous_response_in_progress", "Previous "
                                          "response with id '{id}' is still in progress.",
                                          clip=("id",))
    item_not_found = Entry(404, None, "Item with id '{id}' not found.", clip=("id",))
    no_tool_call_for_output = Entry(400, None, "No tool call found for function call output "
                                    "with call_id {call_id}.", clip=("call_id",))
    conversation_not_found = Entry(404, None, "Conversation with id '{id}' not found.",
                                   clip=("id",))
    background_needs_store = Entry(400, "invalid_value", "Background mode requires stored "
                                   "responses, which are disabled on this server "
                                   "(responses.store_max_entries = 0).")
    too_many_background = Entry(429, "rate_limit_exceeded", "Too many background responses in "
                                "progress on this server (limit {limit}). Try again later.")
    response_too_large_to_store = Entry(400, "request_too_large", "This response is too large "
                                        "to store: about {size} bytes in memory (input, output "
                                        "and the earlier turns it keeps), above this server's "
                                        "budget of {budget} bytes for stored responses "
                                        "(responses.store_max_bytes). Background mode needs a "
                                        "stored response: send a smaller input or create it "
                                        "without background.")
    follow_on_other_worker = Entry(400, "invalid_value", "Response '{id}' is still {state} on "
                                   "another llmsim worker or replica: its events can be "
                                   "followed live only on the one that runs it (with "
                                   "--workers 1 and no --state, from any connection). Once it "
                                   "has finished, the whole stream can be replayed from any "
                                   "of them.")
    response_orphaned = Entry(500, "server_error", "An error occurred while processing your "
                              "request. You can retry your request, or contact us through our "
                              "help center at help.openai.com if the error persists. (The "
                              "llmsim worker running this response ended.)", type="server_error",
                              names_param=False)
    """The ``error`` of a background response whose worker died (``response.failed``)."""
    cancel_not_background = Entry(400, None, "Only responses created with background=true can "
                                  "be cancelled.", names_param=False)
    after_not_found = Entry(400, "invalid_value", "Invalid 'after': no item with id '{id}'.",
                            clip=("id",))
    background_needs_store_true = Entry(400, "invalid_value", "Background mode requires "
                                        "'store' to be true.")
    invalid_encrypted_content = Entry(400, "invalid_encrypted_content", "The encrypted "
                                      "content of '{param}' could not be verified: pass back "
                                      "the compaction item exactly as it was returned.")
    compaction_input_empty = Entry(400, "invalid_value", "Nothing to compact: '{param}' and "
                                   "the previous response give no items.")
    too_many_mcp_servers = Entry(400, "array_above_max_length", "Invalid '{param}': at most "
                                 "{max} MCP servers (tools of type 'mcp') a request, got "
                                 "{count}.")
    too_many_approvals = Entry(400, "array_above_max_length", "Invalid '{param}': at most {max} "
                               "MCP approval responses in one input, got {count}.")
    mcp_approval_unknown = Entry(400, "invalid_value", "Invalid '{param}': no pending MCP "
                                 "approval request with id '{id}'.", clip=("id",))
    background_over_websocket = Entry(400, "unsupported_parameter", "Background mode is not "
                                      "supported over WebSocket.")
    json_word_required_input = Entry(400, "invalid_value", "Response input messages must "
                                     "contain the word 'json' in some form to use 'text.format' "
                                     "of type 'json_object'.")
    item_reference_unsupported = Entry(400, "invalid_value", "item_reference items are not "
                                       "supported here.")
    conversations_disabled = Entry(400, None, "Conversations are disabled on this server "
                                   "(responses.conversations_max_entries = 0).",
                                   names_param=False)

    # --- Anthropic Messages (its own wording: pydantic-style "location: problem") -----------
    anthropic_field_required = Entry(400, "invalid_value", "{param}: Field required")
    anthropic_extra_input = Entry(400, "invalid_value", "{param}: Extra inputs are not "
                                  "permitted")
    anthropic_not_content = Entry(400, "invalid_value", "{param}: Input should be a valid "
                                  "string or a list of content blocks")
    anthropic_unknown_block = Entry(400, "invalid_value", "{where}: Input tag '{tag}' found "
                                    "using 'type' does not match any of the expected tags: "
                                    "{allowed}", clip=("tag",))
    anthropic_unknown_tag = Entry(400, "invalid_value", "{where}: Input tag does not match any "
                                  "of the expected tags: {allowed}")
    anthropic_not_role = Entry(400, "invalid_value", "{param}: Input should be 'user' or "
                               "'assistant'")
    anthropic_not_strings = Entry(400, "invalid_value", "{param}: Input should be a list of "
                                  "strings")
    anthropic_no_messages = Entry(400, "invalid_value", "{param}: at least one message is "
                                  "required")
    anthropic_tool_not_found = Entry(400, "invalid_value", "Tool '{name}' not found in tools",
                                     clip=("name",))
    anthropic_max_tokens_too_large = Entry(400, "invalid_value", "{param}: {limit} > {max}, "
                                           "which is the maximum allowed number of output "
                                           "tokens for {model}", clip=("model",))
    anthropic_budget_not_below_max = Entry(400, "invalid_value", "`max_tokens` must be greater "
                                           "than `thinking.budget_tokens`. Please consult our "
                                           "documentation at https://docs.claude.com/en/docs/"
                                           "build-with-claude/extended-thinking"
                                           "#max-tokens-and-context-window-size")
    anthropic_prompt_too_long = Entry(400, "invalid_value", "prompt is too long: {prompt} "
                                      "tokens > {max} maximum")
    anthropic_too_many_breakpoints = Entry(400, "invalid_value", "A maximum of 4 blocks with "
                                           "cache_control may be provided. Found {found}.")
    anthropic_ttl_order = Entry(400, "invalid_value", "{param}: a ttl='1h' cache_control block "
                                "must not come after a ttl='5m' cache_control block (longer "
                                "lifetimes first, in the order tools, system, messages)")

    # --- rate limits, faults and overload -----------------------------------------------------
    rate_limited = Entry(429, "rate_limit_exceeded", "Rate limit reached for {model} in "
                         "organization org-llmsim on {what}: Limit {limit}, Used {used}, "
                         "Requested {requested}. Please try again in {wait}. "
                         + RATE_LIMIT_URL, names_param=False)
    """``type`` is the bucket (``requests`` or ``tokens``), as the real API sends it."""
    rate_limited_shared = Entry(429, "rate_limit_exceeded", "Rate limit reached.",
                                type="requests", names_param=False)
    """The shared (Redis) buckets refused where the local words found room (a race)."""
    request_too_large_tpm = Entry(429, "rate_limit_exceeded", "Request too large for {model} "
                                  "in organization org-llmsim on tokens per min (TPM): Limit "
                                  "{limit}, Requested {requested}. The input or output tokens "
                                  "must be reduced in order to run successfully. "
                                  + RATE_LIMIT_URL, type="tokens", names_param=False)
    insufficient_quota = Entry(429, "insufficient_quota", "You exceeded your current quota, "
                               "please check your plan and billing details. For more "
                               "information on this error, read the docs: "
                               "https://platform.openai.com/docs/guides/error-codes/"
                               "api-errors.", type="insufficient_quota", names_param=False)
    server_error = Entry(500, "server_error", SERVER_ERROR_MESSAGE, type="server_error",
                         names_param=False)
    """The real API's 500 for a failure on its side (another 5xx status: ``at(status=N)``)."""
    server_fault = Entry(500, None, SERVER_ERROR_MESSAGE, type="server_error", names_param=False)
    """The same wording without a code: an injected 5xx, a failed WebSocket upgrade."""
    bad_gateway = Entry(502, None, "Bad gateway.", type="server_error", names_param=False)
    engine_overloaded = Entry(503, None, "The engine is currently overloaded, please try again "
                              "later.", type="server_error", names_param=False)
    gateway_timeout = Entry(504, None, "Gateway timeout: the server did not answer in time. "
                            "Please try again later.", type="timeout_error", names_param=False)
    overloaded_529 = Entry(529, "overloaded", _OVERLOADED, type="overloaded_error",
                           names_param=False)
    injected = Entry(400, "injected_fault", _INJECTED, names_param=False)
    """Any other injected status (``at(status=N, ...)``)."""
    mid_stream_rate_limited = Entry(429, "rate_limit_exceeded", "Rate limit reached while "
                                    "generating the response. Please try again later.",
                                    type="requests", names_param=False)
    mid_stream_overloaded = Entry(503, "server_error", _OVERLOADED, type="server_error",
                                  names_param=False)
    capacity_overloaded = Entry(503, None, "That model is currently overloaded with other "
                                "requests. You can retry your request, or contact us through "
                                "our help center at help.openai.com if the error persists. "
                                "(Please include the request ID {request_id} in your "
                                "message.)", type="server_error", names_param=False,
                                overloaded=True)
    connection_reset = Entry(502, "connection_reset", "Connection reset by peer (injected "
                             "fault).", type="server_error", names_param=False)
    fault_header_invalid = Entry(400, "invalid_value", "Invalid value for header "
                                 "'X-LLMSim-Fault': {value} ({reason}). Expected 'none' or "
                                 "{help}.", type="invalid_request_error", clip=("value",))
    too_many_fault_rules = Entry(429, "too_many_rules", "{reason}", type="invalid_request_error",
                                 names_param=False)
    fault_rule_invalid = Entry(400, "invalid_value", "Invalid fault rule: {reason}",
                               type="invalid_request_error")
    fault_rule_not_found = Entry(404, "not_found", "No fault rule with id '{id}'.",
                                 clip=("id",))

    # --- authentication --------------------------------------------------------------------
    api_key_missing = Entry(401, None, "You didn't provide an API key. You need to provide your "
                            "API key in an Authorization header using Bearer auth (i.e. "
                            "Authorization: Bearer YOUR_KEY), or as the password field (with "
                            "blank username) if you're accessing the API from your browser and "
                            "are prompted for a username and password. You can obtain an API "
                            "key from https://platform.openai.com/account/api-keys.",
                            type="invalid_request_error", names_param=False)
    api_key_invalid = Entry(401, "invalid_api_key", "Incorrect API key provided: {key}. You "
                            "can find your API key at "
                            "https://platform.openai.com/account/api-keys.",
                            type="invalid_request_error", names_param=False)
    admin_key_missing = Entry(401, None, "You didn't provide an {name}. Changes under /llmsim/ "
                              "(fault rules, stats reset) require one of the {flag} keys: send "
                              "it in an Authorization header using Bearer auth (i.e. "
                              "Authorization: Bearer YOUR_KEY) or in an X-LLMSim-Admin-Key "
                              "header.", type="invalid_request_error", names_param=False)
    admin_key_invalid = Entry(401, "invalid_admin_key", _ADMIN_INVALID,
                              type="invalid_request_error", names_param=False)
    admin_api_key_invalid = Entry(401, "invalid_api_key", _ADMIN_INVALID,
                                  type="invalid_request_error", names_param=False)

    # --- admin: scripts and cassettes ---------------------------------------------------------
    script_too_large = Entry(413, "request_too_large", "A script is at most {limit} bytes.",
                             names_param=False)
    script_invalid = Entry(400, "invalid_script", "Invalid script: {reason}")
    journal_off = Entry(404, "journal_off", "The request journal is off: start llmsim with "
                        "--journal N to keep the last N requests.", names_param=False)
    journal_since_invalid = Entry(400, "invalid_value", "Invalid '{param}': expected a journal "
                                  "sequence number (an integer).")
    script_exhausted = Entry(400, "script_exhausted", "Script rule {rule} has no turn left for "
                             "this session ({turns} turns, then: error).", names_param=False)
    cassette_too_large = Entry(502, None, "The upstream answer is larger than a cassette may be "
                               "({limit} bytes, --record-max-bytes).", type="server_error",
                               names_param=False)
    record_budget_spent = Entry(502, "record_budget_exhausted", "This recording session has "
                                "written its {limit} bytes of cassettes "
                                "(--record-budget-bytes); restart it to record more.",
                                type="server_error", names_param=False)
    upstream_error = Entry(502, "upstream_error", "The upstream {base} did not answer: "
                           "{reason}.", type="server_error", names_param=False,
                           clip=("reason",))
    upstream_timeout = Entry(504, "upstream_timeout", "The upstream {base} did not answer "
                             "within {what} ({seconds} s, {flag}).", type="timeout_error",
                             names_param=False)
    no_upstream = Entry(502, "upstream_error", "No upstream is configured for {path} "
                        "(--record-upstream or --record-route).", type="server_error",
                        names_param=False, clip=("path",))
    cassette_not_found = Entry(404, "cassette_not_found", "No cassette matches this request "
                               "(key {key}; matching uses the method, the path as sent, "
                               "stream and the body without its ignored fields). {nearest}",
                               names_param=False, clip=("nearest",))

    realtime_record_too_long = Entry(502, None, "This Realtime session has more {what} than "
                                     "a cassette may hold ({limit}); the recording ends here.",
                                     type="server_error", names_param=False)
    realtime_cassette_not_found = Entry(404, "cassette_not_found", "No cassette answers this "
                                        "Realtime response (key {key}; matching uses the "
                                        "path, the model and the client's events so far, "
                                        "without ids and ignored fields). {nearest}",
                                        names_param=False, clip=("nearest",))

    # --- WebSocket and shared state ----------------------------------------------------------
    websocket_unsupported = Entry(400, "websocket_not_supported", "WebSocket is not supported "
                                  "on this server.", names_param=False)
    websocket_wrong_endpoint = Entry(400, "websocket_not_supported", "WebSocket upgrades are "
                                     "only supported on GET /v1/responses, not {method} "
                                     "{path}.", type="invalid_request_error", names_param=False,
                                     clip=("method", "path"))
    websocket_not_get = Entry(400, "invalid_websocket_handshake", "A WebSocket upgrade must "
                              "use GET, not {method}.", type="invalid_request_error",
                              names_param=False, clip=("method",))
    websocket_not_http11 = Entry(400, "invalid_websocket_handshake", "A WebSocket upgrade "
                                 "needs HTTP/1.1.", type="invalid_request_error",
                                 names_param=False)
    websocket_no_connection_upgrade = Entry(400, "invalid_websocket_handshake", "Invalid "
                                            "WebSocket handshake: the Connection header must "
                                            "include 'Upgrade'.", type="invalid_request_error",
                                            names_param=False)
    websocket_bad_key = Entry(400, "invalid_websocket_handshake", "Invalid WebSocket "
                              "handshake: Sec-WebSocket-Key must be 16 bytes in base64.",
                              type="invalid_request_error", names_param=False)
    websocket_version = Entry(426, "invalid_websocket_handshake", "Unsupported WebSocket "
                              "version: only version 13 is supported.",
                              type="invalid_request_error", names_param=False)
    websocket_upgrade_required = Entry(426, "websocket_upgrade_required", "GET /v1/responses is "
                                       "the Responses WebSocket endpoint: connect with "
                                       "'Connection: Upgrade' and 'Upgrade: websocket' (the "
                                       "SDK's client.responses.connect()), or create a response "
                                       "with POST /v1/responses.", type="invalid_request_error",
                                       names_param=False)
    websocket_time_limit = Entry(400, "websocket_connection_limit_reached", "Responses "
                                 "websocket connection limit reached ({span}). Create a new "
                                 "websocket connection to continue.", names_param=False)
    websocket_binary_message = Entry(400, "invalid_message_type", "Binary messages are not "
                                     "supported: send each client event as a JSON text "
                                     "message.", names_param=False)
    websocket_invalid_json = Entry(400, "invalid_json", "Invalid JSON in client event: "
                                   "{reason}. Each message must be one JSON object such as "
                                   "{{\"type\": \"response.create\", ...}}.", names_param=False,
                                   clip=("reason",))
    websocket_not_an_event = Entry(400, "invalid_type", "Invalid client event: expected a JSON "
                                   "object with a 'type' field.", names_param=False)
    steer_input_invalid = Entry(400, "invalid_value", "Invalid '{param}': expected a string or "
                                "a non-empty array of input messages.")
    steering_not_supported = Entry(400, "steering_not_supported", "Steering is not supported by "
                                   "this simulator: send the input in a new response.create "
                                   "with previous_response_id.", names_param=False)
    steer_response_not_found = Entry(400, "response_not_found", "No response with id "
                                     "'{id}' is running on this connection.",
                                     names_param=False, clip=("id",))
    steer_response_completed = Entry(400, "response_already_completed", "Response '{id}' "
                                     "has completed and no longer accepts steering input.",
                                     names_param=False, clip=("id",))
    invalid_stream_id = Entry(400, "invalid_stream_id", "Invalid '{param}': expected 1 to 256 "
                              "ASCII letters, digits, underscores, hyphens or periods.")
    server_shutting_down = Entry(503, "server_shutting_down", "The server is shutting down; "
                                 "open a new connection.", type="server_error",
                                 names_param=False)
    too_many_websocket_streams = Entry(400, "websocket_stream_limit_reached", "Too many "
                                       "WebSocket streams on this connection: the limit is "
                                       "{limit} distinct stream_id values.")
    too_many_websockets = Entry(429, "too_many_websocket_connections", "Too many concurrent "
                                "WebSocket connections: the limit is {limit}. Close one or "
                                "retry later.", type="rate_limit_error", names_param=False)
    # --- the Realtime API (api/realtime) ----------------------------------------------------
    realtime_active_response = Entry(400, "conversation_already_has_active_response",
                                     "Conversation already has an active response in "
                                     "progress: {id}. Wait until the response is finished "
                                     "before creating a new one.", names_param=False)
    realtime_cancel_not_active = Entry(400, "response_cancel_not_active", "Cancellation "
                                       "failed: no active response found.", names_param=False)
    realtime_commit_empty = Entry(400, "input_audio_buffer_commit_empty", "Error committing "
                                  "input audio buffer: buffer too small. Expected at least "
                                  "100ms of audio, but buffer only has {ms}ms of audio.",
                                  names_param=False)
    realtime_append_too_large = Entry(400, "request_too_large", "Invalid '{param}': {size} "
                                      "bytes of base64 audio in one event, above the limit "
                                      "of {cap} bytes. Send the audio in smaller appends.")
    realtime_buffer_full = Entry(400, "input_audio_buffer_too_large", "The input audio buffer "
                                 "would hold {ms} ms of audio, above this server's bound of "
                                 "{cap} ms: commit or clear it (or turn server VAD on).",
                                 names_param=False)
    realtime_bad_base64 = Entry(400, "invalid_value", "Invalid '{param}': expected base64-"
                                "encoded audio bytes.")
    realtime_item_not_found = Entry(400, "item_not_found", "Error {what} item: the item with "
                                    "id '{id}' does not exist.", clip=("id",))
    realtime_truncate_invalid = Entry(400, "invalid_value", "Invalid '{param}': {reason}.")
    realtime_session_expired = Entry(400, "session_expired", "Your session hit the maximum "
                                     "duration of {span}.", names_param=False)
    realtime_item_too_large = Entry(400, "request_too_large", "Invalid '{param}': {size} "
                                    "characters, above this server's bound of {cap} per "
                                    "conversation item.")
    shared_state_unavailable = Entry(503, "shared_state_unavailable", "Shared state is "
                                     "unavailable ({reason}); try again shortly.",
                                     type="server_error", names_param=False)

    # --- other providers' families (each renders these in its own envelope) -----------------
    gemini_invalid_value = Entry(400, "invalid_argument", "Invalid value at '{param}': {what}")
    gemini_unknown_field = Entry(400, "invalid_argument", 'Invalid JSON payload received. '
                                 'Unknown name "{param}": Cannot find field.')
    gemini_model_not_found = Entry(404, "model_not_found", "models/{model} is not found for API "
                                   "version v1beta, or is not supported for generateContent.",
                                   names_param=False, clip=("model",))
    ollama_invalid = Entry(400, "invalid_argument", "invalid {param}: {what}")
    ollama_model_not_found = Entry(404, "model_not_found", "model '{model}' not found",
                                   clip=("model",))
    ollama_no_thinking = Entry(400, "invalid_argument", '"{model}" does not support thinking',
                               clip=("model",))
    azure_api_version_missing = Entry(404, "api_version_missing", "Resource not found")
    azure_api_version_unsupported = Entry(400, "api_version_unsupported",
                                          "API version not supported")
    bedrock_invalid = Entry(400, "validation_error", "{param}: {what}")
    bedrock_missing_auth = Entry(403, "MissingAuthenticationTokenException",
                                 "Missing Authentication Token", names_param=False)
    bedrock_unknown_key = Entry(403, "UnrecognizedClientException", "The security token "
                                "included in the request is invalid.", names_param=False)
    bedrock_bad_signature = Entry(403, "InvalidSignatureException", "The request signature we "
                                  "calculated does not match the signature you provided. Check "
                                  "your AWS Secret Access Key and signing method. Consult the "
                                  "service documentation for details.", names_param=False)


def missing(param: str) -> APIError:
    """The real API's wording for a missing required parameter."""
    return E.missing.at(param)


def not_found_model(model: str) -> APIError:
    return E.model_not_found.at("model", model=model)


def server_error(status: int = 500, code: Literal["server_error"] | None = "server_error",
                 headers: list[tuple[str, str]] | None = None) -> APIError:
    """The real API's 500 for a failure on the server's side (a bug, never the client's
    input): the answer to any exception between dispatch and the last byte; with another
    ``status``/``code``/``headers``, the same wording for an injected 5xx."""
    if code is None:
        return E.server_fault.at(status=status, headers=headers)
    assert code == "server_error", code
    return E.server_error.at(status=status, headers=headers)


def scripted(status: int, message: str, type: str | None, code: str | None,
             headers: list[tuple[str, str]]) -> APIError:
    """The error a test script defines (``reply: {error: {...}}``): its author writes the
    status, message, type and code, so this one is not a catalogue entry."""
    return APIError(status, message, type=type, code=code, headers=headers)
