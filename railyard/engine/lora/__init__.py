"""LoRA adapters: the request type, the PEFT adapter reader and the bookkeeping of which adapters are loaded and
which device slot holds each (no torch here: the runner's layers/lora.py and kernels/lora.py hold the math)."""
