"""Style adapters (LoRA) per session, batched: one base forward for the whole batch, and each row
its own low-rank update.

A fused adapter (``W + s B A`` written into the weights) makes every row of a batch share it;
an adapter per row keeps ``W`` as it is and adds ``s_b (x_b A_b^T) B_b^T`` for row ``b``, with
``A_b``, ``B_b`` gathered from the adapters loaded at start (the idea of batched LoRA serving:
the scheduler's batching key does not include the adapter). Ranks differ between adapters:
each is padded with zeros to the largest, which changes nothing.

    bank = AdapterBank(model)                      # every nn.Linear an adapter names is wrapped
    bank.add("ink", read_pairs(state), alpha=16)   # {module: (A, B)}, alpha as the file says
    with bank.rows(["ink", None, "ink"], [1.0, 0.0, 0.6]):
        out = model(x)                             # row 0 inked, row 1 plain, row 2 at 0.6

Family-agnostic: the Wan runner and the default model use it alike.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn


class AdapterError(ValueError):
    """An adapter that does not fit the model, or a name that is not loaded."""


LORA_PARTS = {  # the names published files give a LoRA's two factors: (down, in) then (out, up)
    "lora_A": "A", "lora_B": "B", "lora_down": "A", "lora_up": "B", "lora.down": "A", "lora.up": "B",
}


def read_pairs(state: dict[str, torch.Tensor], prefixes: Sequence[str] = ("base_model.model.", "transformer.",
                                                                         "diffusion_model.")
               ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float | None]:
    """A LoRA state dict in PEFT's (``x.lora_A.weight``, ``x.lora_A.default.weight``), diffusers'
    (``x.lora.down.weight``) or the kohya form (``x.lora_down.weight`` with ``x.alpha``) as
    ({module: (A (rank, in), B (out, rank))}, alpha if the file states one). A key that is none
    of these, a module with one factor only, or factors that do not chain are named."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    alphas: set[float] = set()
    for key, val in state.items():
        k = key.replace(".default", "")
        for p in prefixes:
            k = k.removeprefix(p)
        if k.endswith(".alpha"):
            alphas.add(float(val))
            continue
        for part, side in LORA_PARTS.items():
            if f".{part}.weight" in k or k.endswith(f".{part}"):
                module = k[: k.index(f".{part}")]
                pairs.setdefault(module, {})[side] = val
                break
        else:
            raise AdapterError(f"adapter key {key!r} is not a LoRA factor (lora_A/lora_B, lora_down/lora_up) or alpha")
    out = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter module {module!r} has only its {''.join(ab)} factor")
        a, b = ab["A"].float(), ab["B"].float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"adapter module {module!r}: A {tuple(a.shape)} and B {tuple(b.shape)} are not "
                               f"(rank, in) and (out, rank)")
        out[module] = (a, b)
    if len(alphas) > 1:
        raise AdapterError(f"adapter states several alphas {sorted(alphas)}: one per adapter is supported")
    return out, (alphas.pop() if alphas else None)


class BatchedLoRALinear(nn.Module):
    """``base`` (an ``nn.Linear``, left as it is) plus, per row of the batch, the low-rank update
    of that row's adapter. The adapters' factors are stacked (slot 0 is no adapter: zeros)."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base = base
        dev = base.weight.device
        self.register_buffer("a", torch.zeros(1, 0, base.in_features, device=dev), persistent=False)
        self.register_buffer("b", torch.zeros(1, base.out_features, 0, device=dev), persistent=False)
        self.register_buffer("scale", torch.zeros(1, device=dev), persistent=False)
        self.slots: torch.Tensor | None = None  # (B,) slot per row, set by ``AdapterBank.rows``
        self.gains: torch.Tensor | None = None  # (B,) the session's scale per row

    def put(self, slot: int, a: torch.Tensor | None, b: torch.Tensor | None, scale: float) -> None:
        """Adapter ``slot``'s factors (None: this adapter leaves the module alone)."""
        rank = max(self.a.shape[1], a.shape[0] if a is not None else 0)
        slots = max(self.a.shape[0], slot + 1)
        grown_a = self.a.new_zeros(slots, rank, self.base.in_features)
        grown_b = self.b.new_zeros(slots, self.base.out_features, rank)
        grown_a[: self.a.shape[0], : self.a.shape[1]] = self.a
        grown_b[: self.b.shape[0], :, : self.b.shape[2]] = self.b
        grown_s = self.scale.new_zeros(slots)
        grown_s[: self.scale.shape[0]] = self.scale
        if a is not None and b is not None:
            if a.shape[1] != self.base.in_features or b.shape[0] != self.base.out_features:
                raise AdapterError(f"adapter factors A {tuple(a.shape)}, B {tuple(b.shape)} do not fit a linear "
                                   f"layer of {self.base.in_features} -> {self.base.out_features}")
            grown_a[slot, : a.shape[0]] = a.to(grown_a)
            grown_b[slot, :, : b.shape[1]] = b.to(grown_b)
            grown_s[slot] = scale
        self.a, self.b, self.scale = grown_a, grown_b, grown_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        if self.slots is None or self.a.shape[1] == 0:
            return out
        if x.shape[0] != self.slots.shape[0]:
            raise AdapterError(f"a batch of {x.shape[0]} rows, adapters set for {self.slots.shape[0]}")
        a, b = self.a[self.slots], self.b[self.slots]  # (B, r, in), (B, out, r)
        gain = (self.scale[self.slots] * self.gains).to(out.dtype)  # (B,)
        rows = x.to(a.dtype).reshape(x.shape[0], -1, x.shape[-1])  # (B, T, in)
        up = torch.matmul(torch.matmul(rows, a.transpose(1, 2)), b.transpose(1, 2))  # (B, T, out)
        return out + gain.view(-1, *([1] * (out.dim() - 1))) * up.to(out.dtype).view(out.shape)


@dataclass(frozen=True)
class Loaded:
    slot: int
    rank: int
    alpha: float
    modules: tuple[str, ...]


class AdapterBank:
    """The adapters a model serves, loaded at start. ``add`` wraps each target ``nn.Linear`` of
    ``model`` once (``BatchedLoRALinear``); ``rows`` sets every wrapped module's per-row slots
    and scales for the forwards inside it."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.adapters: dict[str, Loaded] = {}
        self.wrapped: dict[str, BatchedLoRALinear] = {}

    def _wrap(self, name: str) -> BatchedLoRALinear:
        if name in self.wrapped:
            return self.wrapped[name]
        parent_name, _, leaf = name.rpartition(".")
        try:
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            base = getattr(parent, leaf)
        except AttributeError:
            raise AdapterError(f"adapter target {name!r} is not a module of the model") from None
        if not isinstance(base, nn.Linear):
            raise AdapterError(f"adapter target {name!r} is a {type(base).__name__}, not a linear layer")
        wrapped = BatchedLoRALinear(base)
        setattr(parent, leaf, wrapped)
        self.wrapped[name] = wrapped
        return wrapped

    def add(self, adapter: str, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
            alpha: float | None = None) -> None:
        """Load ``adapter``: {module: (A, B)}; its scale is ``alpha / rank`` (PEFT's; alpha
        defaults to the rank). Every target is checked before anything is installed."""
        if adapter in self.adapters:
            raise AdapterError(f"adapter {adapter!r} is loaded already")
        if not pairs:
            raise AdapterError(f"adapter {adapter!r} has no LoRA factors")
        ranks = {a.shape[0] for a, _ in pairs.values()}
        if len(ranks) != 1:
            raise AdapterError(f"adapter {adapter!r} has ranks {sorted(ranks)}: one rank per adapter is supported")
        rank = ranks.pop()
        targets = {name: self._wrap(name) for name in pairs}
        for name, (a, b) in pairs.items():  # shapes, before any is written
            base = targets[name].base
            if a.shape[1] != base.in_features or b.shape[0] != base.out_features:
                raise AdapterError(f"adapter {adapter!r}: {name!r} has A {tuple(a.shape)}, B {tuple(b.shape)}; the "
                                   f"layer is {base.in_features} -> {base.out_features}")
        slot = len(self.adapters) + 1
        alpha = float(rank if alpha is None else alpha)
        for name, module in self.wrapped.items():
            a, b = pairs.get(name, (None, None))
            module.put(slot, a, b, alpha / rank)
        self.adapters[adapter] = Loaded(slot, rank, alpha, tuple(sorted(pairs)))

    def slot(self, adapter: str | None) -> int:
        if adapter is None:
            return 0
        if adapter not in self.adapters:
            raise AdapterError(f"no adapter {adapter!r} is loaded (loaded: {sorted(self.adapters) or 'none'})")
        return self.adapters[adapter].slot

    @contextmanager
    def rows(self, adapters: Sequence[str | None], scales: Sequence[float] | None = None) -> Iterator[None]:
        """Inside: row ``i`` of every batch runs with ``adapters[i]`` at ``scales[i]`` (1.0)."""
        slots = torch.tensor([self.slot(a) for a in adapters], dtype=torch.long)
        gains = torch.tensor(list(scales) if scales is not None else [1.0] * len(adapters), dtype=torch.float32)
        for m in self.wrapped.values():
            m.slots, m.gains = slots.to(m.a.device), gains.to(m.a.device)
        try:
            yield
        finally:
            for m in self.wrapped.values():
                m.slots = m.gains = None
