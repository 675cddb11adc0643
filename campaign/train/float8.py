"""`precision: float8`: torchao's float8 training (rowwise scaling) of the model's linear layers.

    reason = float8.unsupported(device)     # None where float8 matmuls run, else why not (one line)
    float8.convert(model)                   # before parallelize / compile, as torchao asks

Float8 matmuls (`torch._scaled_mm`) need an NVIDIA GPU of compute capability 8.9 or newer
(Ada, Hopper and later); CPU, XPU and earlier GPUs are refused with that reason, exit 93 (a
configuration error: no relaunch fixes it). torchao is an optional dependency (the `float8`
extra). The output head stays in bf16 (as torchtitan leaves it: its logits feed the loss), and
so does any linear layer whose dimensions are not multiples of 16 (float8 GEMMs need them).
Everything else runs under bf16 autocast as with `precision: bf16`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

MIN_CAPABILITY = (8, 9)
RECIPE = "rowwise"


def unsupported(device: Any) -> str | None:
    """Why float8 training cannot run on `device` (a torch.device), or None."""
    if device.type != "cuda":
        return (f"precision: float8 needs an NVIDIA GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"or newer (float8 matmuls); this rank's device is {device.type}: use precision: bf16")
    import torch

    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        return (f"precision: float8 needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer "
                f"(Ada, Hopper); {torch.cuda.get_device_name(device)} has {cap[0]}.{cap[1]}: use precision: bf16")
    if importlib.util.find_spec("torchao") is None:
        return "precision: float8 needs torchao: pip install 'campaign[float8]' (or torchao) where the trainer runs"
    return None


def _eligible(module: Any, fqn: str) -> bool:
    import torch

    return (isinstance(module, torch.nn.Linear) and fqn.rsplit(".", 1)[-1] != "head"
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert(model: Any) -> int:
    """Swap the eligible linear layers of `model` for torchao's Float8Linear (rowwise
    scaling); returns how many were converted."""
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(RECIPE), module_filter_fn=_eligible)
    after = sum(type(m) is torch.nn.Linear for m in model.modules())
    return before - after
