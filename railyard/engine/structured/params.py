"""What a request asks its output to conform to: plain data, picklable, no xgrammar needed to build it."""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any

from railyard.errors import InvalidRequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    """One constraint on a request's output, as vLLM's `structured_outputs` spells it: exactly one of
    a JSON schema, a regular expression, a list of choices, an EBNF grammar, or any JSON object.

    `json` may be given as a schema object or its JSON text; it is kept as the object.
    """

    json: dict[str, Any] | bool | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # xgrammar EBNF (GBNF-style), root rule `root`
    json_object: bool = False
    # JSON kinds: True allows no whitespace beyond the separators ", " and ": "; None takes the engine's default.
    disable_any_whitespace: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS[:4] if getattr(self, k) is not None] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise InvalidRequestError(
                "structured outputs take exactly one of json, regex, choice, grammar or json_object; got "
                + (", ".join(given) if given else "none"))
        if isinstance(self.json, str):
            try:
                self.json = _json.loads(self.json)
            except ValueError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from None
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise InvalidRequestError("a JSON schema must be an object (or true / false)")
        if self.regex is not None and not (isinstance(self.regex, str) and self.regex):
            raise InvalidRequestError("regex must be a non-empty string")
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise InvalidRequestError("grammar must be a non-empty string")
        if self.disable_any_whitespace is not None and not isinstance(self.disable_any_whitespace, bool):
            raise InvalidRequestError("disable_any_whitespace must be true or false")
        if self.choice is not None and not (isinstance(self.choice, list) and self.choice
                                            and all(isinstance(c, str) for c in self.choice)):
            raise InvalidRequestError("choice must be a non-empty list of strings")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS[:4] if getattr(self, k) is not None) if not self.json_object else "json_object"

    def key(self) -> str:
        """Equal for constraints that compile to the same grammar: compiled grammars are cached by it."""
        kind = self.kind
        value = {"json": self.json, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                 "json_object": True}[kind]
        whitespace = bool(self.disable_any_whitespace) and kind in ("json", "json_object")
        return _json.dumps([kind, whitespace, value], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
