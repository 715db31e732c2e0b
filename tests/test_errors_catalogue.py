"""The error catalogue (llmsim.errors.E): every entry rendered once, the rule that no error is
built by hand outside errors.py, and the bound on client values pasted into messages."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmsim.errors import MAX_ECHO, APIError, E, Entry, bounded, quoted, server_error

from . import rawhttp

ENTRIES = {name: e for name, e in vars(E).items() if isinstance(e, Entry)}

# (entry, param, fields, status, type, code, param in the answer, message): the wording each
# entry renders, with every field shown as <name>. The existing tests check many of these
# against real requests; this table makes each entry's rendering explicit (a changed wording
# fails here first) and names the entries that no request test reaches.
ROWS: list[tuple[str, str | None, dict[str, Any], int, str, str | None, str | None, str]] = [
    ('empty_body', None, {},
     400, 'invalid_request_error', None, None,
     "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)"),
    ('invalid_json', None, {},
     400, 'invalid_request_error', None, None,
     "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"),
    ('body_not_object', None, {},
     400, 'invalid_request_error', 'invalid_type', None,
     'The request body must be a JSON object.'),
    ('nested_too_deep', 'p.q', {'where': '<where>', 'depth': '<depth>'},
     400, 'invalid_request_error', 'nesting_above_max_depth', 'p.q',
     'Invalid <where>: nested too deeply. Objects and arrays may nest at most <depth> levels.'),
    ('body_too_large', None, {'limit': '<limit>'},
     413, 'invalid_request_error', 'request_too_large', None,
     'Request body too large: the limit is <limit> bytes.'),
    ('headers_too_large', None, {'limit': '<limit>'},
     431, 'invalid_request_error', 'request_header_fields_too_large', None,
     'Request header fields too large: the limit is <limit> bytes.'),
    ('malformed_http', None, {'reason': '<reason>'},
     400, 'invalid_request_error', 'bad_request', None,
     'Malformed HTTP request: <reason>.'),
    ('invalid_url', None, {'method': '<method>', 'path': '<path>'},
     404, 'invalid_request_error', None, None,
     'Invalid URL (<method> <path>)'),
    ('method_not_allowed', None, {'method': '<method>', 'path': '<path>', 'allow': '<allow>'},
     405, 'invalid_request_error', 'method_not_allowed', None,
     'Invalid method for URL (<method> <path>); allowed: <allow>'),
    ('missing', 'p.q', {},
     400, 'invalid_request_error', 'missing_required_parameter', 'p.q',
     "Missing required parameter: 'p.q'."),
    ('one_of_required', 'p.q', {'fields': '<fields>'},
     400, 'invalid_request_error', 'missing_required_parameter', 'p.q',
     "Invalid 'p.q': one of <fields> is required."),
    ('invalid_type', 'p.q', {'expected': '<expected>'},
     400, 'invalid_request_error', 'invalid_type', 'p.q',
     "Invalid type for 'p.q': expected <expected>."),
    ('invalid_type_got', 'p.q', {'expected': '<expected>', 'got': '<got>'},
     400, 'invalid_request_error', 'invalid_type', 'p.q',
     "Invalid type for 'p.q': expected <expected>, but got <got> instead."),
    ('invalid_value', 'p.q', {'value': '<value>', 'allowed': '<allowed>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value: '<value>'. Supported values are: <allowed>."),
    ('invalid_param', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q'."),
    ('not_a_boolean', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value for 'p.q': expected a boolean."),
    ('out_of_range', 'p.q', {'lo': '<lo>', 'hi': '<hi>', 'value': '<value>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': expected a value between <lo> and <hi>, but got <value> instead."),
    ('integer_below_min', 'p.q', {'lo': '<lo>', 'value': '<value>'},
     400, 'invalid_request_error', 'integer_below_min_value', 'p.q',
     "Invalid 'p.q': integer below minimum value. Expected a value >= <lo>, but got <value> instead."),
    ('integer_above_max', 'p.q', {'hi': '<hi>', 'value': '<value>'},
     400, 'invalid_request_error', 'integer_above_max_value', 'p.q',
     "Invalid 'p.q': integer above maximum value. Expected a value <= <hi>, but got <value> instead."),
    ('decimal_below_min', 'p.q', {'lo': '<lo>', 'value': '<value>'},
     400, 'invalid_request_error', 'decimal_below_min_value', 'p.q',
     "Invalid 'p.q': decimal below minimum value. Expected a value >= <lo>, but got <value> instead."),
    ('decimal_above_max', 'p.q', {'hi': '<hi>', 'value': '<value>'},
     400, 'invalid_request_error', 'decimal_above_max_value', 'p.q',
     "Invalid 'p.q': decimal above maximum value. Expected a value <= <hi>, but got <value> instead."),
    ('string_too_long', 'p.q', {'max_len': '<max_len>', 'length': '<length>'},
     400, 'invalid_request_error', 'string_above_max_length', 'p.q',
     "Invalid 'p.q': string too long. Expected a string with maximum length <max_len>, but got a string with length <length> instead."),
    ('metadata_key_too_long', 'p.q', {'key': '<key>'},
     400, 'invalid_request_error', 'metadata_key_too_long', 'p.q',
     "Invalid 'p.q': key '<key>' is too long. Expected a key with maximum length 64."),
    ('too_many_properties', 'p.q', {'max': '<max>', 'count': '<count>'},
     400, 'invalid_request_error', 'object_above_max_properties', 'p.q',
     "Invalid 'p.q': too many properties. Expected an object with at most <max> properties, but got an object with <count> properties instead."),
    ('empty_array', 'p.q', {'min_len': '<min_len>'},
     400, 'invalid_request_error', 'empty_array', 'p.q',
     "Invalid 'p.q': empty array. Expected an array with minimum length <min_len>, but got an empty array instead."),
    ('array_too_short', 'p.q', {},
     400, 'invalid_request_error', 'array_below_min_length', 'p.q',
     "Invalid 'p.q': array too short."),
    ('array_too_long', 'p.q', {'max_len': '<max_len>', 'length': '<length>'},
     400, 'invalid_request_error', 'array_above_max_length', 'p.q',
     "Invalid 'p.q': array too long. Expected an array with maximum length <max_len>, but got an array with length <length> instead."),
    ('name_pattern', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."),
    ('unrecognized_argument', None, {'key': '<key>'},
     400, 'invalid_request_error', None, None,
     'Unrecognized request argument supplied: <key>'),
    ('unknown_parameter', 'p.q', {},
     400, 'invalid_request_error', 'unknown_parameter', 'p.q',
     "Unknown parameter: 'p.q'."),
    ('mutually_exclusive', 'p.q', {'names': '<names>'},
     400, 'invalid_request_error', 'mutually_exclusive_parameters', 'p.q',
     'Mutually exclusive parameters: Ensure you are only providing one of: <names>.'),
    ('unsupported_parameter', 'p.q', {'hint': '<hint>'},
     400, 'invalid_request_error', 'unsupported_parameter', 'p.q',
     "Unsupported parameter: 'p.q' is not supported with this model.<hint>"),
    ('unsupported_default_only', 'p.q', {'value': '<value>', 'default': '<default>'},
     400, 'invalid_request_error', 'unsupported_value', 'p.q',
     "Unsupported value: 'p.q' does not support <value> with this model. Only the default (<default>) value is supported."),
    ('unsupported_value', 'p.q', {'value': '<value>', 'allowed': '<allowed>'},
     400, 'invalid_request_error', 'unsupported_value', 'p.q',
     "Unsupported value: 'p.q' does not support '<value>' with this model. Supported values are: <allowed>."),
    ('unsupported_value_for_model', 'p.q', {'value': '<value>', 'model': '<model>', 'allowed': '<allowed>'},
     400, 'invalid_request_error', 'unsupported_value', 'p.q',
     "Unsupported value: '<value>' is not supported with the '<model>' model. Supported values are: <allowed>."),
    ('stream_options_without_stream', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    ('limit_too_large', 'p.q', {'limit': '<limit>', 'max': '<max>', 'unit': '<unit>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q is too large: <limit>. This model supports at most <max> <unit> tokens, whereas you provided <limit>.'),
    ('top_logprobs_without_logprobs', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value for 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used."),
    ('min_tokens_too_large', 'p.q', {'bound': '<bound>', 'value': '<value>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'min_tokens must be less than or equal to <bound>, got <value>.'),
    ('tool_message_orphan', 'p.q', {},
     400, 'invalid_request_error', None, 'p.q',
     "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."),
    ('tool_calls_unanswered', 'p.q', {'ids': '<ids>'},
     400, 'invalid_request_error', None, 'p.q',
     "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: <ids>"),
    ('invalid_tool_call', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': expected an object with 'id', 'type' and 'function'."),
    ('tool_choice_without_tools', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."),
    ('tool_choice_unknown_function', 'p.q', {'name': '<name>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value for 'tool_choice': function '<name>' not found in 'tools'."),
    ('tool_choice_required_without_tools', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Tool choice 'required' must be specified with 'tools' parameter."),
    ('tool_choice_not_in_tools', 'p.q', {'name': '<name>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Tool choice '<name>' not found in 'tools' parameter."),
    ('duplicate_tool_name', 'p.q', {'name': '<name>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Duplicate tool name: '<name>'."),
    ('json_word_required', 'p.q', {},
     400, 'invalid_request_error', None, 'p.q',
     "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'."),
    ('context_chat_completion', 'p.q', {'window': '<window>', 'least': '<least>', 'total': '<total>', 'prompt': '<prompt>', 'completion': '<completion>'},
     400, 'invalid_request_error', 'context_length_exceeded', 'p.q',
     "This model's maximum context length is <window> tokens. However, you requested <least><total> tokens (<least><prompt> in the messages, <completion> in the completion). Please reduce the length of the messages or completion."),
    ('context_chat_messages', 'p.q', {'window': '<window>', 'least': '<least>', 'prompt': '<prompt>'},
     400, 'invalid_request_error', 'context_length_exceeded', 'p.q',
     "This model's maximum context length is <window> tokens. However, your messages resulted in <least><prompt> tokens. Please reduce the length of the messages."),
    ('context_prompt', 'p.q', {'window': '<window>', 'least': '<least>', 'total': '<total>', 'prompt': '<prompt>', 'completion': '<completion>'},
     400, 'invalid_request_error', 'context_length_exceeded', 'p.q',
     "This model's maximum context length is <window> tokens, however you requested <least><total> tokens (<least><prompt> in your prompt; <completion> for the completion). Please reduce your prompt; or completion length."),
    ('context_tokenize', 'p.q', {'window': '<window>', 'count': '<count>'},
     400, 'invalid_request_error', 'context_length_exceeded', 'p.q',
     "This model's maximum context length is <window> tokens; the prompt has at least <count>."),
    ('context_window_exceeded', 'p.q', {'least': '<least>', 'total': '<total>', 'asked': '<asked>', 'window': '<window>'},
     400, 'invalid_request_error', 'context_length_exceeded', 'p.q',
     'Your input exceeds the context window of this model (<least><total> tokens<asked> > <window>). Please adjust your input and try again.'),
    ('request_work_too_large', 'p.q', {'n': '<n>', 'tokens': '<tokens>', 'each': '<each>', 'bound': '<bound>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "This request asks llmsim to simulate <n> × <tokens> tokens<each>, above the simulator's per-request bound of <bound> token-units (choices × max tokens × (1 + top_logprobs)). Lower the token limit, 'n' or 'top_logprobs'."),
    ('conversation_item_too_large', 'p.q', {'size': '<size>', 'cap': '<cap>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "This item is too large to keep in a conversation: about <size> bytes in memory, above this server's bound of <cap> bytes per conversation (responses.conversation_max_bytes). Send a smaller item."),
    ('invalid_schema', 'p.q', {'label': '<label>', 'context': '<context>', 'detail': '<detail>'},
     400, 'invalid_request_error', 'invalid_json_schema', 'p.q',
     'Invalid schema for <label>: In context=<context>, <detail>.'),
    ('schema_over_bound', 'p.q', {'label': '<label>', 'context': '<context>', 'detail': '<detail>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "Schema for <label> is over llmsim's work bound: In context=<context>, <detail>. This is a limit of the simulator, not of the API."),
    ('schema_generation_bound', 'p.q', {'where': '<where>', 'what': '<what>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "Generating a value for <where> needs <what>. This is a bound of the simulator, not of the API: simplify the schema (fewer nested or combined subschemas, smaller minItems/minLength/repetition counts) or ask for fewer choices ('n')."),
    ('best_of_below_n', 'p.q', {'best_of': '<best_of>', 'n': '<n>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'best_of must be greater than or equal to n, got best_of=<best_of> and n=<n>.'),
    ('best_of_stream', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'Cannot stream results with best_of greater than 1.'),
    ('invalid_token', 'p.q', {'token': '<token>', 'top': '<top>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid token in 'p.q': <token> is not a token id of this model's vocabulary (0 to <top>)."),
    ('embeddings_invalid_input', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."),
    ('dimensions_unsupported', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'This model does not support specifying dimensions.'),
    ('max_tokens_per_request', 'p.q', {'total': '<total>', 'max': '<max>'},
     400, 'invalid_request_error', 'max_tokens_per_request', 'p.q',
     'Requested <total> tokens, max <max> tokens per request.'),
    ('model_not_found', 'p.q', {'model': '<model>'},
     404, 'invalid_request_error', 'model_not_found', 'p.q',
     'The model `<model>` does not exist or you do not have access to it.'),
    ('model_not_found_retrieve', 'p.q', {'model': '<model>'},
     404, 'invalid_request_error', 'model_not_found', 'p.q',
     "The model '<model>' does not exist"),
    ('model_not_supported', 'p.q', {'model': '<model>', 'what': '<what>'},
     400, 'invalid_request_error', 'model_not_supported', 'p.q',
     "The model '<model>' does not support <what>."),
    ('detokenize_unavailable', None, {},
     501, 'server_error', 'not_implemented', None,
     "Detokenizing needs the exact tokenizer: install llmsim's 'tokens' extra (tiktoken) and do not use --tokenizer estimate."),
    ('response_not_found', 'p.q', {'id': '<id>'},
     404, 'invalid_request_error', None, 'p.q',
     "Response with id '<id>' not found."),
    ('previous_response_not_found', 'p.q', {'id': '<id>'},
     400, 'invalid_request_error', 'previous_response_not_found', 'p.q',
     "Previous response with id '<id>' not found."),
    ('previous_response_in_progress', 'p.q', {'id': '<id>'},
     400, 'invalid_request_error', 'previous_response_in_progress', 'p.q',
     "Previous response with id '<id>' is still in progress."),
    ('item_not_found', 'p.q', {'id': '<id>'},
     404, 'invalid_request_error', None, 'p.q',
     "Item with id '<id>' not found."),
    ('no_tool_call_for_output', 'p.q', {'call_id': '<call_id>'},
     400, 'invalid_request_error', None, 'p.q',
     'No tool call found for function call output with call_id <call_id>.'),
    ('conversation_not_found', 'p.q', {'id': '<id>'},
     404, 'invalid_request_error', None, 'p.q',
     "Conversation with id '<id>' not found."),
    ('background_needs_store', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'Background mode requires stored responses, which are disabled on this server (responses.store_max_entries = 0).'),
    ('too_many_background', 'p.q', {'limit': '<limit>'},
     429, 'rate_limit_error', 'rate_limit_exceeded', 'p.q',
     'Too many background responses in progress on this server (limit <limit>). Try again later.'),
    ('response_too_large_to_store', 'p.q', {'size': '<size>', 'budget': '<budget>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "This response is too large to store: about <size> bytes in memory (input, output and the earlier turns it keeps), above this server's budget of <budget> bytes for stored responses (responses.store_max_bytes). Background mode needs a stored response: send a smaller input or create it without background."),
    ('follow_on_other_worker', 'p.q', {'id': '<id>', 'state': '<state>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Response '<id>' is still <state> on another llmsim worker or replica: its events can be followed live only on the one that runs it (with --workers 1 and no --state, from any connection). Once it has finished, the whole stream can be replayed from any of them."),
    ('response_orphaned', None, {},
     500, 'server_error', 'server_error', None,
     'An error occurred while processing your request. You can retry your request, or contact us through our help center at help.openai.com if the error persists. (The llmsim worker running this response ended.)'),
    ('cancel_not_background', None, {},
     400, 'invalid_request_error', None, None,
     'Only responses created with background=true can be cancelled.'),
    ('after_not_found', 'p.q', {'id': '<id>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'after': no item with id '<id>'."),
    ('background_needs_store_true', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Background mode requires 'store' to be true."),
    ('invalid_encrypted_content', 'p.q', {},
     400, 'invalid_request_error', 'invalid_encrypted_content', 'p.q',
     "The encrypted content of 'p.q' could not be verified: pass back the compaction item exactly as it was returned."),
    ('compaction_input_empty', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Nothing to compact: 'p.q' and the previous response give no items."),
    ('too_many_mcp_servers', 'p.q', {'max': '<max>', 'count': '<count>'},
     400, 'invalid_request_error', 'array_above_max_length', 'p.q',
     "Invalid 'p.q': at most <max> MCP servers (tools of type 'mcp') a request, got <count>."),
    ('too_many_approvals', 'p.q', {'max': '<max>', 'count': '<count>'},
     400, 'invalid_request_error', 'array_above_max_length', 'p.q',
     "Invalid 'p.q': at most <max> MCP approval responses in one input, got <count>."),
    ('mcp_approval_unknown', 'p.q', {'id': '<id>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': no pending MCP approval request with id '<id>'."),
    ('background_over_websocket', 'p.q', {},
     400, 'invalid_request_error', 'unsupported_parameter', 'p.q',
     'Background mode is not supported over WebSocket.'),
    ('json_word_required_input', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Response input messages must contain the word 'json' in some form to use 'text.format' of type 'json_object'."),
    ('item_reference_unsupported', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'item_reference items are not supported here.'),
    ('conversations_disabled', None, {},
     400, 'invalid_request_error', None, None,
     'Conversations are disabled on this server (responses.conversations_max_entries = 0).'),
    ('anthropic_field_required', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: Field required'),
    ('anthropic_extra_input', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: Extra inputs are not permitted'),
    ('anthropic_not_content', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: Input should be a valid string or a list of content blocks'),
    ('anthropic_unknown_block', 'p.q', {'where': '<where>', 'tag': '<tag>', 'allowed': '<allowed>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "<where>: Input tag '<tag>' found using 'type' does not match any of the expected tags: <allowed>"),
    ('anthropic_unknown_tag', 'p.q', {'where': '<where>', 'allowed': '<allowed>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     '<where>: Input tag does not match any of the expected tags: <allowed>'),
    ('anthropic_not_role', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "p.q: Input should be 'user' or 'assistant'"),
    ('anthropic_not_strings', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: Input should be a list of strings'),
    ('anthropic_no_messages', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: at least one message is required'),
    ('anthropic_tool_not_found', 'p.q', {'name': '<name>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Tool '<name>' not found in tools"),
    ('anthropic_too_many_breakpoints', 'p.q', {'found': '<found>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'A maximum of 4 blocks with cache_control may be provided. Found <found>.'),
    ('anthropic_ttl_order', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "p.q: a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block (longer lifetimes first, in the order tools, system, messages)"),
    ('anthropic_max_tokens_too_large', 'p.q', {'limit': '<limit>', 'max': '<max>', 'model': '<model>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'p.q: <limit> > <max>, which is the maximum allowed number of output tokens for <model>'),
    ('anthropic_budget_not_below_max', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     '`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size'),
    ('anthropic_prompt_too_long', 'p.q', {'prompt': '<prompt>', 'max': '<max>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'prompt is too long: <prompt> tokens > <max> maximum'),
    ('rate_limited', None, {'model': '<model>', 'what': '<what>', 'limit': '<limit>', 'used': '<used>', 'requested': '<requested>', 'wait': '<wait>'},
     429, 'rate_limit_error', 'rate_limit_exceeded', None,
     'Rate limit reached for <model> in organization org-llmsim on <what>: Limit <limit>, Used <used>, Requested <requested>. Please try again in <wait>. Visit https://platform.openai.com/account/rate-limits to learn more.'),
    ('rate_limited_shared', None, {},
     429, 'requests', 'rate_limit_exceeded', None,
     'Rate limit reached.'),
    ('request_too_large_tpm', None, {'model': '<model>', 'limit': '<limit>', 'requested': '<requested>'},
     429, 'tokens', 'rate_limit_exceeded', None,
     'Request too large for <model> in organization org-llmsim on tokens per min (TPM): Limit <limit>, Requested <requested>. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.'),
    ('insufficient_quota', None, {},
     429, 'insufficient_quota', 'insufficient_quota', None,
     'You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.'),
    ('server_error', None, {},
     500, 'server_error', 'server_error', None,
     'The server had an error while processing your request. Sorry about that!'),
    ('server_fault', None, {},
     500, 'server_error', None, None,
     'The server had an error while processing your request. Sorry about that!'),
    ('bad_gateway', None, {},
     502, 'server_error', None, None,
     'Bad gateway.'),
    ('engine_overloaded', None, {},
     503, 'server_error', None, None,
     'The engine is currently overloaded, please try again later.'),
    ('gateway_timeout', None, {},
     504, 'timeout_error', None, None,
     'Gateway timeout: the server did not answer in time. Please try again later.'),
    ('overloaded_529', None, {},
     529, 'overloaded_error', 'overloaded', None,
     'The server is currently overloaded, please try again later.'),
    ('injected', None, {},
     400, 'invalid_request_error', 'injected_fault', None,
     'Injected fault: HTTP 400.'),
    ('mid_stream_rate_limited', None, {},
     429, 'requests', 'rate_limit_exceeded', None,
     'Rate limit reached while generating the response. Please try again later.'),
    ('mid_stream_overloaded', None, {},
     503, 'server_error', 'server_error', None,
     'The server is currently overloaded, please try again later.'),
    ('capacity_overloaded', None, {'request_id': '<request_id>'},
     503, 'server_error', None, None,
     'That model is currently overloaded with other requests. You can retry your request, or contact us through our help center at help.openai.com if the error persists. (Please include the request ID <request_id> in your message.)'),
    ('connection_reset', None, {},
     502, 'server_error', 'connection_reset', None,
     'Connection reset by peer (injected fault).'),
    ('fault_header_invalid', 'p.q', {'value': '<value>', 'reason': '<reason>', 'help': '<help>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid value for header 'X-LLMSim-Fault': <value> (<reason>). Expected 'none' or <help>."),
    ('too_many_fault_rules', None, {'reason': '<reason>'},
     429, 'invalid_request_error', 'too_many_rules', None,
     '<reason>'),
    ('fault_rule_invalid', 'p.q', {'reason': '<reason>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'Invalid fault rule: <reason>'),
    ('fault_rule_not_found', 'p.q', {'id': '<id>'},
     404, 'invalid_request_error', 'not_found', 'p.q',
     "No fault rule with id '<id>'."),
    ('api_key_missing', None, {},
     401, 'invalid_request_error', None, None,
     "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys."),
    ('api_key_invalid', None, {'key': '<key>'},
     401, 'invalid_request_error', 'invalid_api_key', None,
     'Incorrect API key provided: <key>. You can find your API key at https://platform.openai.com/account/api-keys.'),
    ('admin_key_missing', None, {'name': '<name>', 'flag': '<flag>'},
     401, 'invalid_request_error', None, None,
     "You didn't provide an <name>. Changes under /llmsim/ (fault rules, stats reset) require one of the <flag> keys: send it in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY) or in an X-LLMSim-Admin-Key header."),
    ('admin_key_invalid', None, {'name': '<name>', 'key': '<key>', 'flag': '<flag>'},
     401, 'invalid_request_error', 'invalid_admin_key', None,
     'Incorrect <name> provided: <key>. Changes under /llmsim/ (fault rules, stats reset) require one of the <flag> keys.'),
    ('admin_api_key_invalid', None, {'name': '<name>', 'key': '<key>', 'flag': '<flag>'},
     401, 'invalid_request_error', 'invalid_api_key', None,
     'Incorrect <name> provided: <key>. Changes under /llmsim/ (fault rules, stats reset) require one of the <flag> keys.'),
    ('script_too_large', None, {'limit': '<limit>'},
     413, 'invalid_request_error', 'request_too_large', None,
     'A script is at most <limit> bytes.'),
    ('script_invalid', 'p.q', {'reason': '<reason>'},
     400, 'invalid_request_error', 'invalid_script', 'p.q',
     'Invalid script: <reason>'),
    ('journal_off', None, {},
     404, 'invalid_request_error', 'journal_off', None,
     'The request journal is off: start llmsim with --journal N to keep the last N requests.'),
    ('journal_since_invalid', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': expected a journal sequence number (an integer)."),
    ('script_exhausted', None, {'rule': '<rule>', 'turns': '<turns>'},
     400, 'invalid_request_error', 'script_exhausted', None,
     'Script rule <rule> has no turn left for this session (<turns> turns, then: error).'),
    ('cassette_too_large', None, {'limit': '<limit>'},
     502, 'server_error', None, None,
     'The upstream answer is larger than a cassette may be (<limit> bytes, --record-max-bytes).'),
    ('record_budget_spent', None, {'limit': '<limit>'},
     502, 'server_error', 'record_budget_exhausted', None,
     'This recording session has written its <limit> bytes of cassettes (--record-budget-bytes); restart it to record more.'),
    ('upstream_error', None, {'base': '<base>', 'reason': '<reason>'},
     502, 'server_error', 'upstream_error', None,
     'The upstream <base> did not answer: <reason>.'),
    ('upstream_timeout', None, {'base': '<base>', 'what': '<what>', 'seconds': '<seconds>', 'flag': '<flag>'},
     504, 'timeout_error', 'upstream_timeout', None,
     'The upstream <base> did not answer within <what> (<seconds> s, <flag>).'),
    ('no_upstream', None, {'path': '<path>'},
     502, 'server_error', 'upstream_error', None,
     'No upstream is configured for <path> (--record-upstream or --record-route).'),
    ('cassette_not_found', None, {'key': '<key>', 'nearest': '<nearest>'},
     404, 'invalid_request_error', 'cassette_not_found', None,
     'No cassette matches this request (key <key>; matching uses the method, the path as sent, stream and the body without its ignored fields). <nearest>'),
    ('realtime_record_too_long', None, {'what': '<what>', 'limit': '<limit>'},
     502, 'server_error', None, None,
     'This Realtime session has more <what> than a cassette may hold (<limit>); the recording ends here.'),
    ('realtime_cassette_not_found', None, {'key': '<key>', 'nearest': '<nearest>'},
     404, 'invalid_request_error', 'cassette_not_found', None,
     "No cassette answers this Realtime response (key <key>; matching uses the path, the model and the client's events so far, without ids and ignored fields). <nearest>"),
    ('websocket_unsupported', None, {},
     400, 'invalid_request_error', 'websocket_not_supported', None,
     'WebSocket is not supported on this server.'),
    ('websocket_wrong_endpoint', None, {'method': '<method>', 'path': '<path>'},
     400, 'invalid_request_error', 'websocket_not_supported', None,
     'WebSocket upgrades are only supported on GET /v1/responses, not <method> <path>.'),
    ('websocket_not_get', None, {'method': '<method>'},
     400, 'invalid_request_error', 'invalid_websocket_handshake', None,
     'A WebSocket upgrade must use GET, not <method>.'),
    ('websocket_not_http11', None, {},
     400, 'invalid_request_error', 'invalid_websocket_handshake', None,
     'A WebSocket upgrade needs HTTP/1.1.'),
    ('websocket_no_connection_upgrade', None, {},
     400, 'invalid_request_error', 'invalid_websocket_handshake', None,
     "Invalid WebSocket handshake: the Connection header must include 'Upgrade'."),
    ('websocket_bad_key', None, {},
     400, 'invalid_request_error', 'invalid_websocket_handshake', None,
     'Invalid WebSocket handshake: Sec-WebSocket-Key must be 16 bytes in base64.'),
    ('websocket_version', None, {},
     426, 'invalid_request_error', 'invalid_websocket_handshake', None,
     'Unsupported WebSocket version: only version 13 is supported.'),
    ('websocket_upgrade_required', None, {},
     426, 'invalid_request_error', 'websocket_upgrade_required', None,
     "GET /v1/responses is the Responses WebSocket endpoint: connect with 'Connection: Upgrade' and 'Upgrade: websocket' (the SDK's client.responses.connect()), or create a response with POST /v1/responses."),
    ('websocket_time_limit', None, {'span': '<span>'},
     400, 'invalid_request_error', 'websocket_connection_limit_reached', None,
     'Responses websocket connection limit reached (<span>). Create a new websocket connection to continue.'),
    ('websocket_binary_message', None, {},
     400, 'invalid_request_error', 'invalid_message_type', None,
     'Binary messages are not supported: send each client event as a JSON text message.'),
    ('websocket_invalid_json', None, {'reason': '<reason>'},
     400, 'invalid_request_error', 'invalid_json', None,
     'Invalid JSON in client event: <reason>. Each message must be one JSON object such as {"type": "response.create", ...}.'),
    ('websocket_not_an_event', None, {},
     400, 'invalid_request_error', 'invalid_type', None,
     "Invalid client event: expected a JSON object with a 'type' field."),
    ('steer_input_invalid', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': expected a string or a non-empty array of input messages."),
    ('steering_not_supported', None, {},
     400, 'invalid_request_error', 'steering_not_supported', None,
     'Steering is not supported by this simulator: send the input in a new response.create with previous_response_id.'),
    ('steer_response_not_found', None, {'id': '<id>'},
     400, 'invalid_request_error', 'response_not_found', None,
     "No response with id '<id>' is running on this connection."),
    ('steer_response_completed', None, {'id': '<id>'},
     400, 'invalid_request_error', 'response_already_completed', None,
     "Response '<id>' has completed and no longer accepts steering input."),
    ('invalid_stream_id', 'p.q', {},
     400, 'invalid_request_error', 'invalid_stream_id', 'p.q',
     "Invalid 'p.q': expected 1 to 256 ASCII letters, digits, underscores, hyphens or periods."),
    ('server_shutting_down', None, {},
     503, 'server_error', 'server_shutting_down', None,
     'The server is shutting down; open a new connection.'),
    ('too_many_websocket_streams', 'p.q', {'limit': '<limit>'},
     400, 'invalid_request_error', 'websocket_stream_limit_reached', 'p.q',
     'Too many WebSocket streams on this connection: the limit is <limit> distinct stream_id values.'),
    ('too_many_websockets', None, {'limit': '<limit>'},
     429, 'rate_limit_error', 'too_many_websocket_connections', None,
     'Too many concurrent WebSocket connections: the limit is <limit>. Close one or retry later.'),
    ('realtime_active_response', None, {'id': '<id>'},
     400, 'invalid_request_error', 'conversation_already_has_active_response', None,
     'Conversation already has an active response in progress: <id>. Wait until the response is finished before creating a new one.'),
    ('realtime_cancel_not_active', None, {},
     400, 'invalid_request_error', 'response_cancel_not_active', None,
     'Cancellation failed: no active response found.'),
    ('realtime_commit_empty', None, {'ms': '<ms>'},
     400, 'invalid_request_error', 'input_audio_buffer_commit_empty', None,
     'Error committing input audio buffer: buffer too small. Expected at least 100ms of audio, but buffer only has <ms>ms of audio.'),
    ('realtime_append_too_large', 'p.q', {'cap': '<cap>', 'size': '<size>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "Invalid 'p.q': <size> bytes of base64 audio in one event, above the limit of <cap> bytes. Send the audio in smaller appends."),
    ('realtime_buffer_full', None, {'cap': '<cap>', 'ms': '<ms>'},
     400, 'invalid_request_error', 'input_audio_buffer_too_large', None,
     "The input audio buffer would hold <ms> ms of audio, above this server's bound of <cap> ms: commit or clear it (or turn server VAD on)."),
    ('realtime_bad_base64', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': expected base64-encoded audio bytes."),
    ('realtime_item_not_found', 'p.q', {'id': '<id>', 'what': '<what>'},
     400, 'invalid_request_error', 'item_not_found', 'p.q',
     "Error <what> item: the item with id '<id>' does not exist."),
    ('realtime_truncate_invalid', 'p.q', {'reason': '<reason>'},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': <reason>."),
    ('realtime_session_expired', None, {'span': '<span>'},
     400, 'invalid_request_error', 'session_expired', None,
     'Your session hit the maximum duration of <span>.'),
    ('realtime_item_too_large', 'p.q', {'cap': '<cap>', 'size': '<size>'},
     400, 'invalid_request_error', 'request_too_large', 'p.q',
     "Invalid 'p.q': <size> characters, above this server's bound of <cap> per conversation item."),
    ('shared_state_unavailable', None, {'reason': '<reason>'},
     503, 'server_error', 'shared_state_unavailable', None,
     'Shared state is unavailable (<reason>); try again shortly.'),
    ('gemini_invalid_value', 'p.q', {'what': '<what>'},
     400, 'invalid_request_error', 'invalid_argument', 'p.q', "Invalid value at 'p.q': <what>"),
    ('gemini_unknown_field', 'p.q', {},
     400, 'invalid_request_error', 'invalid_argument', 'p.q',
     'Invalid JSON payload received. Unknown name "p.q": Cannot find field.'),
    ('gemini_model_not_found', None, {'model': '<model>'},
     404, 'invalid_request_error', 'model_not_found', None,
     'models/<model> is not found for API version v1beta, or is not supported for generateContent.'),
    ('ollama_invalid', 'p.q', {'what': '<what>'},
     400, 'invalid_request_error', 'invalid_argument', 'p.q', 'invalid p.q: <what>'),
    ('ollama_model_not_found', 'p.q', {'model': '<model>'},
     404, 'invalid_request_error', 'model_not_found', 'p.q', "model '<model>' not found"),
    ('ollama_no_thinking', 'p.q', {'model': '<model>'},
     400, 'invalid_request_error', 'invalid_argument', 'p.q', '"<model>" does not support thinking'),
    ('azure_api_version_missing', 'p.q', {},
     404, 'invalid_request_error', 'api_version_missing', 'p.q', 'Resource not found'),
    ('azure_api_version_unsupported', 'p.q', {},
     400, 'invalid_request_error', 'api_version_unsupported', 'p.q', 'API version not supported'),
    ('bedrock_invalid', 'p.q', {'what': '<what>'},
     400, 'invalid_request_error', 'validation_error', 'p.q', 'p.q: <what>'),
    ('bedrock_missing_auth', None, {},
     403, 'permission_error', 'MissingAuthenticationTokenException', None,
     'Missing Authentication Token'),
    ('bedrock_unknown_key', None, {},
     403, 'permission_error', 'UnrecognizedClientException', None,
     'The security token included in the request is invalid.'),
    ('bedrock_bad_signature', None, {},
     403, 'permission_error', 'InvalidSignatureException', None,
     'The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.'),
    ('multipart_invalid', 'p.q', {'reason': '<reason>'},
     400, 'invalid_request_error', 'invalid_multipart', None,
     'Invalid multipart/form-data body: <reason>.'),
    ('multipart_too_many_parts', 'p.q', {'max': '<max>'},
     400, 'invalid_request_error', 'invalid_multipart', None,
     'Invalid multipart/form-data body: more than <max> parts.'),
    ('file_not_found', 'p.q', {'name': '<name>'},
     404, 'invalid_request_error', 'not_found', None,
     "No such file: '<name>' (expired or never generated)."),
    ('image_n_one', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     'You must provide n=1 for this model.'),
    ('image_invalid_file', 'p.q', {'formats': '<formats>'},
     400, 'invalid_request_error', 'invalid_image_format', 'p.q',
     "Invalid 'p.q': expected a <formats> file."),
    ('image_too_large', 'p.q', {'size': '<size>', 'max': '<max>'},
     400, 'invalid_request_error', 'image_too_large', 'p.q',
     "Invalid 'p.q': the image is <size> bytes; this model accepts at most <max> bytes."),
    ('image_not_square', 'p.q', {'width': '<width>', 'height': '<height>'},
     400, 'invalid_request_error', 'invalid_image', 'p.q',
     "Invalid 'p.q': the image must be square (<width>x<height>)."),
    ('too_many_images', 'p.q', {'max': '<max>', 'count': '<count>'},
     400, 'invalid_request_error', 'array_above_max_length', 'p.q',
     "Invalid 'p.q': at most <max> images, got <count>."),
    ('partial_images_without_stream', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'partial_images': only allowed when 'stream' is true."),
    ('audio_too_large', 'p.q', {'size': '<size>', 'max': '<max>'},
     413, 'invalid_request_error', 'audio_too_large', 'p.q',
     "Invalid 'p.q': <size> bytes; the maximum file size is <max> bytes."),
    ('audio_invalid', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': the audio file is empty or could not be decoded."),
    ('granularities_need_verbose', 'p.q', {},
     400, 'invalid_request_error', 'invalid_value', 'p.q',
     "Invalid 'p.q': timestamp granularities require response_format 'verbose_json'."),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_entry_renders(row: tuple[Any, ...]) -> None:
    name, param, fields, status, etype, code, shown_param, message = row
    err = ENTRIES[name].at(param, **fields)
    assert (err.status, err.type, err.code, err.param, err.message) == (
        status, etype, code, shown_param, message)
    assert orjson.loads(err.body()) == {"error": {"message": message, "type": etype,
                                                  "param": shown_param, "code": code}}


def test_every_entry_has_a_row_and_its_fields_are_named() -> None:
    assert sorted(r[0] for r in ROWS) == sorted(ENTRIES)
    fmt = string.Formatter()
    for name, entry in ENTRIES.items():
        fields = {f for _, f, _, _ in fmt.parse(entry.template) if f}
        assert set(entry.clip) <= fields, name  # a bounded field is one the message shows
        if not entry.names_param:
            assert "param" not in fields, name


def test_no_error_is_built_by_hand_outside_the_catalogue() -> None:
    root = Path(__file__).resolve().parent.parent / "llmsim"
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "errors.py" and path.parent == root:
            continue
        for i, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if re.search(r"\bAPIError\(", line):
                found.append(f"{path.relative_to(root.parent)}:{i}: {line.strip()}")
    assert not found, "build errors from llmsim.errors.E instead:\n" + "\n".join(found)


def test_bounded_cuts_long_values_with_an_ellipsis() -> None:
    assert bounded("abc") == "abc"
    assert bounded(12) == "12"
    assert bounded("x" * MAX_ECHO) == "x" * MAX_ECHO
    assert bounded("x" * (MAX_ECHO + 1)) == "x" * MAX_ECHO + "..."
    assert bounded("abcdef", 3) == "abc..."
    assert quoted(("a",)) == "'a'"
    assert quoted(("a", "b")) == "'a' and 'b'"
    assert quoted(("a", "b", "c")) == "'a', 'b', and 'c'"  # the real API's lists


def test_at_bounds_clipped_fields_and_the_param_only() -> None:
    long = "v" * 10_000
    err = E.invalid_value.at("p" * 10_000, value=long, allowed=quoted(("x",) * 200))
    assert err.param == "p" * MAX_ECHO + "..."
    assert "v" * MAX_ECHO + "...'" in err.message and long not in err.message
    assert err.message.endswith(quoted(("x",) * 200) + ".")  # the server's list: whole


def test_overrides_status_type_code_headers() -> None:
    err = E.injected.at(status=418)
    assert (err.status, err.type, err.code, err.message) == (
        418, "invalid_request_error", "injected_fault", "Injected fault: HTTP 418.")
    err = E.rate_limited.at(type="tokens", model="m", what="w", limit=1, used=1, requested=1,
                            wait="1s", headers=[("retry-after", "1")])
    assert (err.type, err.headers, err.param) == ("tokens", [("retry-after", "1")], None)
    err = E.invalid_schema.at("tools[0]", code="invalid_function_parameters", label="f",
                              context="()", detail="d")
    assert err.code == "invalid_function_parameters"
    assert E.capacity_overloaded.at(request_id="r").overloaded
    assert server_error(503, None).code is None and server_error().code == "server_error"


def test_copy_is_a_fresh_equal_error() -> None:
    err = E.api_key_missing.at(headers=[("x", "1")])
    dup = err.copy()
    assert dup is not err and dup.headers is not err.headers
    assert (dup.status, dup.message, dup.to_dict()) == (err.status, err.message, err.to_dict())
    assert isinstance(dup, APIError)


# -- on the wire: a hostile value is echoed bounded, in the OpenAI envelope ------------------

HUGE = "k" * 200_000


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                              HUGE: 1}, None),
    ("/v1/responses", {"model": "gpt-4o", "input": "hi", HUGE: 1}, "bounded"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": HUGE, "content": "hi"}]},
     "messages[0].role"),
    ("/v1/responses", {"model": "gpt-4o", "input": "hi", "previous_response_id": HUGE},
     "previous_response_id"),
])
def test_hostile_values_are_echoed_bounded(srv: Any, path: str, body: dict[str, Any],
                                           param: str | None) -> None:
    r = rawhttp.request(srv.url, "POST", path, orjson.dumps(body))
    assert 400 <= r.status < 500, r.body
    assert len(r.body) < 1200, len(r.body)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "k" * MAX_ECHO + "..." in err["message"] and HUGE not in err["message"]
    if param == "bounded":
        assert err["param"] == "k" * MAX_ECHO + "..."
    else:
        assert err["param"] == param


def test_unknown_model_ids_are_echoed_bounded(make_server: Any) -> None:
    srv = make_server(strict_models=True)
    r = rawhttp.request(srv.url, "GET", "/v1/models/" + "k" * 4000)
    assert r.status == 404, r.body
    err = r.json()["error"]
    assert err["message"] == f"The model '{'k' * MAX_ECHO}...' does not exist"
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", orjson.dumps(
        {"model": HUGE, "messages": [{"role": "user", "content": "hi"}]}))
    assert r.status == 404 and len(r.body) < 1200, r.body[:200]
    assert r.json()["error"]["message"] == (f"The model `{'k' * MAX_ECHO}...` does not exist "
                                            "or you do not have access to it.")


def test_sdk_reads_a_catalogue_error(client: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                                   "content": "hi"}],
                                       extra_body={HUGE: 1})
    assert info.value.status_code == 400
    assert info.value.message.endswith("k" * MAX_ECHO + "...")
    with pytest.raises(openai.NotFoundError) as nf:
        client.responses.retrieve("resp_" + "x" * 1000)
    assert nf.value.param == "response_id"
    assert nf.value.message.endswith(f"Response with id 'resp_{'x' * (MAX_ECHO - 5)}...' "
                                     "not found.")


def _error(srv: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = rawhttp.request(srv.url, "POST", path, orjson.dumps(body))
    assert r.status == 400, r.body
    return r.json()["error"]  # type: ignore[no-any-return]


def test_unsupported_effort_in_the_real_wordings(srv: Any) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    e = _error(srv, "/v1/chat/completions", {"model": "gpt-5.1", "messages": msgs,
                                              "reasoning_effort": "minimal"})
    assert e["message"] == ("Unsupported value: 'reasoning_effort' does not support 'minimal' "
                            "with this model. Supported values are: 'none', 'low', 'medium', "
                            "and 'high'.")
    assert (e["param"], e["code"]) == ("reasoning_effort", "unsupported_value")
    e = _error(srv, "/v1/responses", {"model": "gpt-5.1", "input": "hi",
                                      "reasoning": {"effort": "minimal"}})
    assert e["message"] == ("Unsupported value: 'minimal' is not supported with the 'gpt-5.1' "
                            "model. Supported values are: 'none', 'low', 'medium', and 'high'.")
    assert (e["param"], e["code"]) == ("reasoning.effort", "unsupported_value")


def test_metadata_value_too_long_says_how_long(srv: Any) -> None:
    e = _error(srv, "/v1/responses", {"model": "gpt-4o", "input": "hi",
                                      "metadata": {"k": "v" * 600}})
    assert e["message"] == ("Invalid 'metadata.k': string too long. Expected a string with "
                            "maximum length 512, but got a string with length 600 instead.")
    assert (e["param"], e["code"]) == ("metadata.k", "string_above_max_length")
