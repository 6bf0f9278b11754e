"""Batched LoRA on the decoder's linear layers: every token adds x A^T B^T of its own adapter (or nothing).

As Punica / S-LoRA and vLLM's lora ops do, the adapters live in device slots, one stacked A and B per linear layer,
and each step two kernels per layer run over the tokens grouped by slot: "shrink" h = x A_s^T (to the rank) and
"expand" y += h B_s^T (back to the layer's outputs). A fused projection (qkv, gate/up) holds each part's own A
(stacked along the rank axis: one shrink) and its B over that part's output columns (vLLM's
MergedColumnParallelLinearWithLoRA / QKV): part i's columns take only part i's rank block. On the GPU a gate/up
projection's expand runs inside the MLP's SiLU-and-mul (`silu_and_mul`: the adapters' sums join the activation's one
read of gate/up, instead of a read and a write of their own before it).

Tensor parallel as vLLM shards: a column-parallel layer keeps A whole and B split like its own output rows; a
row-parallel layer splits A like its input columns and keeps B whole, and adds its partial LoRA sums to its partial
output before the all-reduce (the sum over ranks of x_r A_r^T B^T is x A^T B^T).

`LoRABatch` holds the step's slot of every token in a static device buffer the host fills before the forward pass
(or the replay of a CUDA graph); `prepare`, inside the forward pass, orders the tokens by slot on the device, so a
captured graph needs no host sync. The Triton kernels (kernels/lora.py) run on CUDA; elsewhere `reference_lora`,
the same computation in torch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from railyard.engine.runner.decode_graphs import staging_free, upload
from railyard.engine.runner.kernels import lora_ops

# Steps of at most this many tokens split the shrink over K (kernels/lora.py): its programs add their partial sums
# into a zeroed buffer. Every adapted layer's buffer is a column block of the batch's one workspace, zeroed once per
# forward pass (one memset a step, not one per layer and projection).
SPLIT_K_MAX_TOKENS = 256


class LoRABatch:
    """The step's adapter slot per token (-1: the base model) and, derived on the device, the tokens ordered by
    slot: `order` lists the token indices slot by slot, base-model tokens last; slot s owns
    order[starts[s]:starts[s] + counts[s]]. It also holds the shrink outputs' workspace of split-K steps."""

    def __init__(self, num_slots: int, max_tokens: int, device: torch.device) -> None:
        self.num_slots, self.max_tokens, self.device = num_slots, max_tokens, device
        pin = device.type == "cuda"
        self.host = torch.full((max_tokens,), -1, dtype=torch.int32, pin_memory=pin)
        self.host_np = self.host.numpy()
        self.token_slots = torch.full((max_tokens,), -1, dtype=torch.int32, device=device)
        self.order = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.counts = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
        self.starts = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
        self.copied = torch.cuda.Event() if pin else None
        self._filled = 0  # host entries [0, _filled) may hold slots; the rest are -1
        self.workspace_cols = 0  # reserved by the adapted layers (reserve), allocated once they all have (allocate)
        self.workspace: torch.Tensor | None = None

    def reserve(self, width: int) -> int:
        """A column block of the shrink workspace for one adapted layer: its first column."""
        first = self.workspace_cols
        self.workspace_cols += width
        return first

    def allocate(self) -> None:
        """The shrink workspace, [min(max_tokens, SPLIT_K_MAX_TOKENS), reserved columns] float32."""
        rows = min(self.max_tokens, SPLIT_K_MAX_TOKENS)
        self.workspace = torch.zeros(rows, self.workspace_cols, dtype=torch.float32, device=self.device)

    def shrink_out(self, first: int, width: int, num_tokens: int) -> torch.Tensor | None:
        """A layer's zeroed shrink output for a split-K step ([num_tokens, width], a view of the workspace), or
        None where the step is too long to split (the kernel then writes every row it reads into a buffer of its
        own)."""
        if self.workspace is None or num_tokens > self.workspace.shape[0]:
            return None
        return self.workspace[:num_tokens, first:first + width]

    def stage(self, slots: np.ndarray) -> None:
        """Write the next forward pass's per-token slots (its rows beyond them, padding, stay -1) to the device."""
        n = len(slots)
        if n > self.max_tokens:
            raise ValueError(f"a step of {n} tokens exceeds the LoRA batch's {self.max_tokens}")
        staging_free(self.copied)
        h = self.host_np
        h[:n] = slots
        if self._filled > n:
            h[n:self._filled] = -1
        upload(self.copied, (self.token_slots[:max(n, self._filled)], self.host[:max(n, self._filled)]))
        self._filled = n

    def prepare(self, num_tokens: int) -> None:
        """Order the first num_tokens tokens by slot (device work only: CUDA graphs capture it)."""
        key = self.token_slots[:num_tokens].long()
        key = torch.where(key < 0, self.num_slots, key)  # base-model tokens form the last group, never computed
        self.order[:num_tokens].copy_(torch.argsort(key, stable=True))
        counts = torch.zeros(self.num_slots + 1, dtype=torch.long, device=self.device)
        counts.scatter_add_(0, key, torch.ones_like(key))
        self.counts.copy_(counts)
        self.starts.copy_(torch.cumsum(counts, 0) - counts)
        if self.workspace is not None and num_tokens <= self.workspace.shape[0]:
            self.workspace[:num_tokens].zero_()


class LoRAWeights(nn.Module):
    """One linear layer's adapter slots: A [slots, parts * R, in] (part i's A in rows i*R..) and
    B [slots, out, R] (part i's B in part i's output columns), R the padded rank, B pre-multiplied by the scaling."""

    def __init__(self, batch: LoRABatch, rank: int, in_features: int, part_sizes: list[int],
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.batch, self.rank = batch, rank
        self.part_sizes = list(part_sizes)
        self.offsets = [0]
        for n in part_sizes:
            self.offsets.append(self.offsets[-1] + n)
        slots = batch.num_slots
        self.register_buffer("a", torch.zeros(slots, len(part_sizes) * rank, in_features, dtype=dtype,
                                              device=device), persistent=False)
        self.register_buffer("b", torch.zeros(slots, self.offsets[-1], rank, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("part_offsets", torch.tensor(self.offsets, dtype=torch.int32, device=device),
                             persistent=False)
        self.workspace_first = batch.reserve(len(part_sizes) * rank)
        self.parts_aligned = all(offset % 8 == 0 for offset in self.offsets)  # the expand's vector width

    @staticmethod
    def kernels(x: torch.Tensor):
        """The batched LoRA kernels where x runs on them (CUDA), else None (the torch reference)."""
        return lora_ops() if x.is_cuda else None

    def fuses_silu_and_mul(self, x: torch.Tensor) -> bool:
        """Whether silu_and_mul below runs for x: a gate/up projection's slots (two equal parts), on the kernels."""
        return len(self.part_sizes) == 2 and self.part_sizes[0] == self.part_sizes[1] and \
            self.kernels(x) is not None

    def silu_and_mul(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up [T, I] of a gate/up projection's base output y [T, 2I], each token's adapter added
        first: add_to and the activation in one pass over y, which is read once and never written back."""
        ops = self.kernels(x)
        return ops.expand_silu_and_mul(self._shrink(ops, x), self.b, y, self.batch.order, self.batch.counts,
                                       self.batch.starts, self.rank)

    def add_to(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y += each token's x A^T B^T (in place); returns y."""
        ops = self.kernels(x)
        if ops is None:
            return reference_lora(x, y, self.a, self.b, self.batch, self.offsets, self.rank)
        ops.expand(self._shrink(ops, x), self.b, y, self.batch.order, self.batch.counts, self.batch.starts,
                   self.part_offsets, max(self.part_sizes), self.rank, self.parts_aligned)
        return y

    def _shrink(self, ops, x: torch.Tensor) -> torch.Tensor:
        """x A_s^T of each token's slot (float32), into the batch's zeroed workspace on split-K steps."""
        out = self.batch.shrink_out(self.workspace_first, self.a.shape[1], x.shape[0])
        return ops.shrink(x, self.a, self.batch.order, self.batch.counts, self.batch.starts, out)


def reference_lora(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, batch: LoRABatch,
                   offsets: list[int], rank: int) -> torch.Tensor:
    """What the Triton kernels compute, in torch (the CPU path and their tests' oracle): per slot, its tokens'
    shrink in float32, rounded to B's dtype, times B, added to y."""
    counts, starts = batch.counts.tolist(), batch.starts.tolist()
    for slot in range(batch.num_slots):
        if not counts[slot]:
            continue
        idx = batch.order[starts[slot]:starts[slot] + counts[slot]].long()
        h = (x[idx].float() @ a[slot].float().T).to(b.dtype)
        for i in range(len(offsets) - 1):
            lo, hi = offsets[i], offsets[i + 1]
            delta = (h[:, i * rank:(i + 1) * rank].float() @ b[slot, lo:hi].float().T)
            y[:, lo:hi].index_copy_(0, idx, (y[idx, lo:hi].float() + delta).to(y.dtype))
    return y
