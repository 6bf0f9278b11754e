"""`LoRARequest`: which adapter a request runs with (vLLM's LoRARequest: a name, an integer id, a local path)."""

from __future__ import annotations

import msgspec

from railyard.errors import InvalidRequestError


class LoRARequest(msgspec.Struct, frozen=True):
    """An adapter by name (what a request's `model` says), a positive integer id unique for as long as the engine
    runs (it keys the adapter's device slot and its prefix-cache blocks) and the local PEFT directory it loads from.
    Plain data: it crosses the process boundary inside requests and utility calls."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidRequestError("a LoRA adapter needs a non-empty name")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) or self.lora_int_id < 1:
            raise InvalidRequestError(f"LoRA adapter {self.lora_name!r}: lora_int_id must be a positive integer, "
                                      f"got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequestError(f"LoRA adapter {self.lora_name!r}: lora_path must name a local directory")
