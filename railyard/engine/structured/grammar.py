"""A constraint as xgrammar source (schema text, regex or EBNF), checked at the door.

`check` parses the constraint with xgrammar (the tokenizer-free half of compiling: JSON schema to
grammar, regex to grammar, EBNF parsing), so an invalid schema, regex or grammar is refused with a 400
before any engine work. JSON schemas are also screened for keywords xgrammar 0.2 accepts but does not
enforce: refusing them (fail closed, as vLLM does) keeps every constrained output valid under its schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from railyard.engine.structured.params import StructuredOutputsParams
from railyard.errors import InvalidRequestError

# `format` values xgrammar 0.2 turns into a grammar (others it would ignore).
SUPPORTED_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer"})
# Keywords xgrammar 0.2 parses but does not enforce: the generated JSON could violate them.
_UNENFORCED = {
    "not": "'not'", "if": "'if'/'then'/'else'", "then": "'if'/'then'/'else'", "else": "'if'/'then'/'else'",
    "contains": "'contains'", "minContains": "'minContains'", "maxContains": "'maxContains'",
    "dependentRequired": "'dependentRequired'", "dependentSchemas": "'dependentSchemas'",
    "dependencies": "'dependencies'", "unevaluatedItems": "'unevaluatedItems'",
}
# Keywords that may sit beside $ref without constraining anything.
_ANNOTATIONS = frozenset({"$ref", "$defs", "definitions", "$schema", "$id", "$comment", "title", "description",
                          "default", "examples", "deprecated", "readOnly", "writeOnly"})
_SUBSCHEMA = ("additionalProperties", "unevaluatedProperties", "propertyNames", "additionalItems", "items")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


@dataclass(frozen=True)
class GrammarSource:
    """What xgrammar compiles: kind is "json" (schema text), "regex" or "ebnf"."""

    kind: str
    text: str
    any_whitespace: bool = True


def grammar_source(spec: StructuredOutputsParams) -> GrammarSource:
    """The xgrammar input for a constraint; raises InvalidRequestError for an unsupported JSON schema."""
    kind = spec.kind
    any_ws = not spec.disable_any_whitespace
    if kind == "json":
        return GrammarSource("json", json.dumps(supported_schema(spec.json), ensure_ascii=False), any_ws)
    if kind == "json_object":
        return GrammarSource("json", '{"type": "object"}', any_ws)
    if kind == "regex":
        return GrammarSource("regex", spec.regex)
    if kind == "choice":
        # EBNF string literals take JSON's escapes (\" \\ \n \uXXXX); non-ASCII stays as UTF-8.
        return GrammarSource("ebnf", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.choice))
    return GrammarSource("ebnf", spec.grammar)


def check(spec: StructuredOutputsParams) -> None:
    """Raise InvalidRequestError (a 400) if xgrammar cannot turn the constraint into a grammar."""
    source = grammar_source(spec)
    error = _check_source(source)
    if error is not None:
        what = "choice list" if spec.kind == "choice" else {"json": "JSON schema", "regex": "regex",
                                                             "ebnf": "grammar"}[source.kind]
        raise InvalidRequestError(f"invalid {what}: {error}")


@lru_cache(maxsize=1024)
def _check_source(source: GrammarSource) -> str | None:
    import xgrammar as xgr

    try:
        if source.kind == "json":
            xgr.Grammar.from_json_schema(source.text, any_whitespace=source.any_whitespace)
        elif source.kind == "regex":
            xgr.Grammar.from_regex(source.text)
        else:
            xgr.Grammar.from_ebnf(source.text)
    except Exception as exc:  # xgrammar raises RuntimeError (and a few others) with its parser's message
        return clean_message(exc)
    return None


def clean_message(exc: BaseException) -> str:
    """xgrammar's message without its C++ log prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _LOG_PREFIX.sub("", text)


def supported_schema(schema: dict[str, Any] | bool) -> dict[str, Any] | bool:
    """The schema as xgrammar should get it, or InvalidRequestError naming the first keyword it cannot enforce.

    One rewrite: a string with minLength/maxLength (and no pattern or format) becomes a pattern with the same
    bounds, since xgrammar 0.2's length-bounded string rule admits raw control characters (invalid JSON).
    """
    return _walk(schema, "#")


def _walk(node: Any, path: str) -> Any:
    if not isinstance(node, dict):
        return node  # booleans are schemas; anything else xgrammar's own parser refuses
    for key, name in _UNENFORCED.items():
        if key in node:
            raise _unsupported(name, path)
    if node.get("uniqueItems") is True:
        raise _unsupported("'uniqueItems'", path)
    types = node.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if "multipleOf" in node and types != {"integer"}:
        raise _unsupported("'multipleOf' on non-integers", path)
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        raise _unsupported("'allOf' with more than one schema", path)
    if "$ref" in node:
        extra = sorted(set(node) - _ANNOTATIONS)
        if extra:
            raise _unsupported(f"keywords beside '$ref' ({', '.join(extra)})", path)
        if isinstance(node["$ref"], str) and not node["$ref"].startswith("#"):
            raise _unsupported(f"a remote '$ref' ({node['$ref']})", path)
    fmt = node.get("format")
    if fmt is not None and fmt not in SUPPORTED_FORMATS:
        raise _unsupported(f"format {fmt!r}", path)
    lengths = "minLength" in node or "maxLength" in node
    if lengths and ("pattern" in node or fmt is not None):
        raise _unsupported("'minLength'/'maxLength' together with 'pattern' or 'format'", path)
    out = dict(node)
    if lengths and "string" in types and _is_count(node.get("minLength", 0)) and _is_count(node.get("maxLength", 0)):
        low, high = node.get("minLength", 0), node.get("maxLength")
        out.pop("minLength", None)
        out.pop("maxLength", None)
        out["pattern"] = "^[^\\u0000-\\u001f]{%d,%s}$" % (low, "" if high is None else high)
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), dict):
            out[key] = _walk(node[key], f"{path}/{key}")
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_walk(s, f"{path}/{key}/{i}") for i, s in enumerate(node[key])]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {name: _walk(s, f"{path}/{key}/{name}") for name, s in node[key].items()}
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unsupported(what: str, path: str) -> InvalidRequestError:
    return InvalidRequestError(f"the JSON schema uses {what} at {path}, which structured outputs cannot enforce "
                               "(xgrammar would ignore it); remove it or express it with supported keywords")
