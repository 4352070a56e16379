"""A request's structured output, from any of the spellings clients send, checked before the
engine sees it.

OpenAI: `response_format` {"type": "json_object"} or {"type": "json_schema", "json_schema":
{"schema": ...}}. vLLM: `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` and
`structured_outputs` {json, regex, choice, grammar, json_object}. At most one may be set. A
grammar is Lark (llguidance's dialect); GBNF (llama.cpp's, with `::=`) is translated.

Forced tool calls (`tool_choice` "required" or a named function) get a Lark grammar of the
model's Qwen3-Coder XML form, which the prompt has already started (chat.build_chat_prompt):

    <tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

A string parameter's VALUE is free text without '<' (one lexeme with its closing tag, so the
newline before it is never ambiguous), or one of its enum strings; any other parameter's VALUE
is JSON valid against its schema (`%json`), which tool_calls.convert_value reads back. The
required parameters come first, each once; the optional ones may follow.
"""

from __future__ import annotations

import json
from typing import Any

from flashlane.request import StructuredOutput
from flashlane.sampling.grammar import GrammarError, check
from flashlane.server.protocol import ApiError, SamplingFields

JSON_OBJECT = '{"type": "object"}'
# the grammar's JSON as json.dumps writes it (sampling/grammar.py says why)
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def request_structured(req: SamplingFields) -> StructuredOutput | None:
    """The request's constraint (None: free text); 400 naming the field when it is malformed,
    given twice or does not compile."""
    found: list[tuple[str, StructuredOutput]] = []
    fmt = getattr(req, "response_format", None)
    if fmt is not None:
        given = _response_format(fmt)
        if given is not None:
            found.append(("response_format", given))
    for name, make in (
        ("guided_json", lambda v: StructuredOutput(json=_schema_text(v, "guided_json"))),
        ("guided_regex", lambda v: StructuredOutput(regex=v)),
        ("guided_choice", lambda v: StructuredOutput(choice=tuple(v))),
        ("guided_grammar", lambda v: StructuredOutput(grammar=_lark(v))),
    ):
        value = getattr(req, name)
        if value is not None:
            found.append((name, _made(make, value, name)))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", _vllm(req.structured_outputs)))
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise ApiError(400, f"{names} both constrain the reply: send one", param=found[1][0])
    if not found:
        return None
    name, structured = found[0]
    checked(structured, name)
    return structured


def checked(structured: StructuredOutput, param: str) -> StructuredOutput:
    try:
        check(structured)
    except GrammarError as e:
        raise ApiError(400, str(e), param=param) from None
    return structured


def _made(make: Any, value: Any, param: str) -> StructuredOutput:
    try:
        return make(value)
    except ValueError as e:
        raise ApiError(400, f"{param}: {e}", param=param) from None


def _response_format(fmt: dict[str, Any]) -> StructuredOutput | None:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput(json=JSON_OBJECT)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            msg = "response_format json_schema needs json_schema.schema"
            raise ApiError(400, msg, param="response_format.json_schema")
        return StructuredOutput(json=_schema_text(spec["schema"], "response_format"))
    raise ApiError(400, f"response_format type {kind!r} is not supported", param="response_format")


def _vllm(spec: dict[str, Any]) -> StructuredOutput:
    """vLLM's structured_outputs object: one of json, regex, choice, grammar, json_object."""
    param = "structured_outputs"
    if spec.get("json_object"):
        return StructuredOutput(json=JSON_OBJECT)
    kwargs: dict[str, Any] = {}
    if spec.get("json") is not None:
        kwargs["json"] = _schema_text(spec["json"], param)
    if spec.get("regex") is not None:
        kwargs["regex"] = spec["regex"]
    if spec.get("choice") is not None:
        choice = spec["choice"]
        kwargs["choice"] = tuple(choice) if isinstance(choice, list) else choice
    if spec.get("grammar") is not None:
        kwargs["grammar"] = _lark(spec["grammar"]) if isinstance(spec["grammar"], str) else None
    return _made(lambda kw: StructuredOutput(**kw), kwargs, param)


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ApiError(400, f"{param}: the schema is not JSON: {e}", param=param) from None
    if not isinstance(schema, dict):
        raise ApiError(400, f"{param}: the schema must be a JSON object", param=param)
    return json.dumps(schema)


def _lark(text: str) -> str:
    """A Lark grammar as given, or a GBNF one (rules written `name ::= ...`) translated."""
    if "::=" not in text:
        return text
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(text)
    except Exception as e:  # the translator raises plain errors on bad GBNF
        raise ApiError(400, f"the GBNF grammar does not parse: {e}", param="grammar") from None


def tool_call_grammar(
    tools: dict[str, dict[str, Any]],
    named: str | None,
    parallel: bool,
    tag_ids: dict[str, int | None],
) -> StructuredOutput:
    """The rest of a forced tool call after the prompt's "<tool_call>\\n<function=" (and
    "NAME>\\n" when one function is named): `tools` maps names to their parameters' schemas.
    A named call is one call; "required" is one or more (one without parallel_tool_calls).
    `tag_ids`: the token of "<tool_call>" and "</tool_call>" where the vocabulary has one (an
    added token is matched by its id, not its text)."""
    rules: list[str] = []
    names = [named] if named is not None else list(tools)
    end = _tag("</tool_call>", tag_ids)
    for i, name in enumerate(names):
        params = _params_rule(f"t{i}", tools.get(name) or {}, rules)
        head = "" if named is not None else json.dumps(name + ">\n") + " "
        rules.append(f't{i}: {head}{params} "</function>\\n" {end}')
    calls = " | ".join(f"t{i}" for i in range(len(names)))
    if named is not None or not parallel:
        rules.insert(0, f"start: {calls}")
    else:
        again = f'"\\n" {_tag("<tool_call>", tag_ids)} "\\n<function="'
        rules.insert(0, f"start: call ({again} call)*\ncall: {calls}")
    return StructuredOutput(grammar="\n".join(rules))


def _tag(text: str, tag_ids: dict[str, int | None]) -> str:
    token = tag_ids.get(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def _params_rule(prefix: str, schema: dict[str, Any], rules: list[str]) -> str:
    """The rule's body for a function's parameters (required first, then optional ones)."""
    properties = schema.get("properties") or {}
    required = [k for k in schema.get("required") or () if k in properties]
    optional = [k for k in properties if k not in required]
    parts = []
    for j, key in enumerate([*required, *optional]):
        rule = f"{prefix}_p{j}"
        rules.append(f"{rule}: {_param_body(key, properties[key])}")
        parts.append(rule if key in required else f"{rule}?")
    return " ".join(parts) if parts else '""'


def _param_body(key: str, schema: Any) -> str:
    head = json.dumps(f"<parameter={key}>\n")
    close = "\n</parameter>\n"
    schema = schema if isinstance(schema, dict) else {}
    if schema.get("type") == "string":
        enum = [v for v in schema.get("enum") or () if isinstance(v, str) and "<" not in v]
        if enum:
            return head + " (" + " | ".join(json.dumps(v + close) for v in enum) + ")"
        # the text and its closing tag as one lexeme: a regex without '<', then the tag
        return head + r" /[^<]*\n<\/parameter>\n/"
    sub = {**schema, "x-guidance": _COMPACT}
    return f"{head} %json {json.dumps(sub)} {json.dumps(close)}"
