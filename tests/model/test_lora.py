"""Adapters per row of a batch (``model/lora.py``): each row equals PEFT's merged forward of its
own adapter, beside rows with other adapters and with none; files in the published forms read."""

from __future__ import annotations

import copy

import peft
import pytest
import torch
from torch import nn

from worldserve.model.lora import AdapterBank, AdapterError, read_pairs


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.q(x).tanh())


def _peft_adapter(base: Tiny, rank: int, alpha: float, targets: list[str], seed: int) -> nn.Module:
    """A PEFT LoRA on a copy of ``base`` with random (non-zero) factors."""
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    return peft.get_peft_model(copy.deepcopy(base), cfg)


def test_each_row_equals_peft_s_merged_forward_of_its_own_adapter() -> None:
    torch.manual_seed(0)
    base = Tiny().eval()
    ink = _peft_adapter(base, 4, 8.0, ["q", "mlp.0"], seed=1)
    sun = _peft_adapter(base, 2, 2.0, ["mlp.2"], seed=2)
    bank = AdapterBank(copy.deepcopy(base))
    for name, model in (("ink", ink), ("sun", sun)):
        state = peft.get_peft_model_state_dict(model)
        pairs, alpha = read_pairs(state)
        bank.add(name, pairs, model.peft_config["default"].lora_alpha if alpha is None else alpha)
    x = torch.randn(5, 7, 16)
    with bank.rows(["ink", None, "sun", "ink", "sun"], [1.0, 1.0, 1.0, 0.5, 1.0]), torch.no_grad():
        got = bank.model(x)
    merged = {n: m.merge_and_unload().eval() for n, m in (("ink", ink), ("sun", sun))}
    with torch.no_grad():
        want = [merged["ink"](x[0:1]), base(x[1:2]), merged["sun"](x[2:3]), None, merged["sun"](x[4:5])]
        half = _peft_adapter(base, 4, 4.0, ["q", "mlp.0"], seed=1).merge_and_unload()  # scale 0.5: alpha halved
        want[3] = half(x[3:4])
    for i, w in enumerate(want):
        torch.testing.assert_close(got[i : i + 1], w, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(bank.model(x), base(x))  # outside ``rows``: the base


def test_the_published_key_forms_read_alike() -> None:
    a, b = torch.randn(4, 16), torch.randn(32, 4)
    forms = [
        {"base_model.model.mlp.0.lora_A.weight": a, "base_model.model.mlp.0.lora_B.weight": b},
        {"transformer.mlp.0.lora_A.default.weight": a, "transformer.mlp.0.lora_B.default.weight": b},
        {"mlp.0.lora.down.weight": a, "mlp.0.lora.up.weight": b},
        {"diffusion_model.mlp.0.lora_down.weight": a, "diffusion_model.mlp.0.lora_up.weight": b,
         "diffusion_model.mlp.0.alpha": torch.tensor(8.0)},
    ]
    for form in forms:
        pairs, _ = read_pairs(form)
        assert list(pairs) == ["mlp.0"] and torch.equal(pairs["mlp.0"][0], a) and torch.equal(pairs["mlp.0"][1], b)
    assert read_pairs(forms[3])[1] == 8.0 and read_pairs(forms[0])[1] is None


def test_an_adapter_that_does_not_fit_is_refused_by_name_and_installs_nothing() -> None:
    bank = AdapterBank(Tiny())
    misfit = {"q": (torch.randn(2, 16), torch.randn(16, 2)), "mlp.0": (torch.randn(2, 8), torch.randn(32, 2))}
    with pytest.raises(AdapterError, match=r"'mlp\.0'.*16 -> 32"):
        bank.add("bad", misfit)
    assert bank.adapters == {}
    with pytest.raises(AdapterError, match="'nope' is not a module"):
        bank.add("bad", {"nope": (torch.randn(2, 16), torch.randn(16, 2))})
    with pytest.raises(AdapterError, match="not a linear layer"):
        bank.add("bad", {"mlp.1": (torch.randn(2, 16), torch.randn(16, 2))})
    with pytest.raises(AdapterError, match="only its A factor"):
        read_pairs({"q.lora_A.weight": torch.randn(2, 16)})
    with pytest.raises(AdapterError, match="not a LoRA factor"):
        read_pairs({"q.weight": torch.randn(16, 16)})
    with pytest.raises(AdapterError, match="no adapter 'ghost' is loaded"), bank.rows(["ghost"]):
        pass
