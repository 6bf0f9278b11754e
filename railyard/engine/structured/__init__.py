"""Structured outputs (constrained decoding) with xgrammar: JSON schema, regex, choice and EBNF constraints.

`params` is the request-side spec (plain data); `grammar` checks a spec at the door; `compiler` compiles
specs off the step loop, cached; `manager` keeps per-sequence matchers and fills each step's token bitmask;
`apply` masks the logits on the device. Only `params` is imported eagerly: xgrammar loads on first use.
"""

from railyard.engine.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
