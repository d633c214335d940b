"""Build it yourself 3: the master-weight (O2) step, graded against ampteach.MasterWeights + torch.amp.GradScaler.

    from ampteach.grading.checks import check_master_step
    check_master_step(make_master_copies, master_step)
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.common import passed as _passed

__all__ = ["check_master_step"]


def check_master_step(make_master_copies: Callable, master_step: Callable) -> None:
    """make_master_copies(model) -> [(half_param, fp32_copy), ...]; master_step(pairs, optimizer, scaler)
    runs after scaler.scale(loss).backward(). Graded against ampteach.MasterWeights + torch.amp.GradScaler
    (SGD with momentum and AdamW, five steps each, an overflow injected at step 2), bit for bit."""
    import torch.nn.functional as F

    from ampteach.amp.master import MasterWeights, to_half
    from ampteach.training.models import mlp

    for opt_name in ("sgd", "adamw"):
        torch.manual_seed(0)
        model = to_half(mlp((32,)))
        mine = copy.deepcopy(model)
        pairs = make_master_copies(mine)
        params = list(mine.parameters())
        if not isinstance(pairs, list) or len(pairs) != len(params):
            raise CheckFailed(f"make_master_copies: expected a list of {len(params)} (half, fp32) pairs, "
                              f"got {pairs!r:.200}")
        for i, (p, m) in enumerate(pairs):
            if p is not params[i] or m.dtype != torch.float32 or not m.requires_grad or not torch.equal(m, p.float()):
                raise CheckFailed(f"make_master_copies, pair {i}: expected (the model's parameter {i}, an fp32 leaf "
                                  f"copy with requires_grad and the same values), got ({p.dtype} {tuple(p.shape)}, "
                                  f"{m.dtype} requires_grad={m.requires_grad})")
            if m.untyped_storage().data_ptr() == p.untyped_storage().data_ptr():
                raise CheckFailed(f"make_master_copies, pair {i}: the fp32 copy must not share memory with the model")
        master = MasterWeights(model)
        make_opt = (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)) if opt_name == "sgd" else \
            (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        opt_ref, opt_me = make_opt(master.params), make_opt([m for _, m in pairs])
        scaler_ref, scaler_me = (torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) for _ in range(2))
        gen = torch.Generator().manual_seed(1)
        for step in range(5):
            x, y = torch.randn(32, 1, 28, 28, generator=gen).half(), torch.randint(0, 10, (32,), generator=gen)
            for net, scaler in ((model, scaler_ref), (mine, scaler_me)):
                net.zero_grad(set_to_none=True)
                scaler.scale(F.cross_entropy(net(x).float(), y)).backward()  # fp16 grads, times S
                if step == 2:
                    next(net.parameters()).grad[0, 0] = float("inf")         # an overflow: skip this step
            master.grads_to_master()
            scaler_ref.step(opt_ref)
            scaler_ref.update()
            master.master_to_model()
            master_step(pairs, opt_me, scaler_me)
            case = f"{opt_name}, step {step}" + (" (an inf gradient: the step must be skipped)" if step == 2 else "")
            if scaler_me.get_scale() != scaler_ref.get_scale():
                raise CheckFailed(f"{case}: expected loss scale {scaler_ref.get_scale()}, got {scaler_me.get_scale()} "
                                  f"(scaler.step then scaler.update, once per step)")
            for i, ((p, m), (q, n)) in enumerate(zip(pairs, master.pairs)):
                if not torch.equal(m, n):
                    raise CheckFailed(f"{case}: fp32 copy {i} differs from the reference (max |difference| "
                                      f"{(m - n).abs().max().item():.3g}): its .grad must be the model's grad in fp32")
                if not torch.equal(p, q):
                    raise CheckFailed(f"{case}: model parameter {i} differs from the reference: after the step, "
                                      f"copy the fp32 values back into the half model")
    _passed("check_master_step",
            "SGD and AdamW, 5 steps each with an overflow: same fp32 copies, half weights and scale")

