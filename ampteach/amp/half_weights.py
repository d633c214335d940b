"""Pure half weights trained by any torch optimizer: fp32 arithmetic for the step, a rounding rule for the write-back.

    model = to_half(mlp(), torch.bfloat16)             # bf16 weights, and nothing else kept in fp32
    half = HalfWeights(model, rounding="kahan")        # or "stochastic", "nearest"
    opt = torch.optim.SGD(half.params, lr=1e-3)        # steps fp32 working copies of the weights
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)            # bf16 forward (no autocast needed)
        opt.zero_grad(set_to_none=True); model.zero_grad(set_to_none=True)
        loss.backward()                                # bf16 grads on the model
        half.grads_to_master()                         # working copies float(w), grads float(w.grad)
        opt.step()                                     # the optimizer's arithmetic, in fp32
        half.master_to_model()                         # w <- rule(w, u); the working copies are freed

The same five calls as ampteach.MasterWeights (so train_step runs it unchanged), with one
difference: the fp32 copies live for the optimizer step only. The optimizer's fp32 result
w + u is then written into the half weight w by `rounding`:

    "nearest"     w <- round(w + u)             what w.add_(u) does: u is lost once |u| < half a gap
    "kahan"       kahan_add_(w, u, c)           c (half, per weight) keeps what rounding dropped
    "stochastic"  w <- round_stochastic(w + u)  E[w] = w + u: kept on average; bf16 only

This is how torchao's `_AdamW(bf16_stochastic_round=True)` works (pytorch/ao PR #1124: "optimizer
step calculations are always done in FP32"; the loss happens when the fp32 result is copied into the
bf16 weight). Between steps a model keeps 2 bytes per weight (4 with "kahan"'s compensation),
where MasterWeights keeps 2 + 4 + 4 (half weight, fp32 master and its gradient). The optimizer's own
state is fp32 (zeros_like the fp32 working copy).
"""

from __future__ import annotations

import torch
from torch import nn

from ampteach.amp.kahan import kahan_add_
from ampteach.amp.master import MasterWeights
from ampteach.amp.stochastic_rounding import round_stochastic

__all__ = ["HalfWeights", "ROUNDINGS"]

ROUNDINGS = ("nearest", "kahan", "stochastic")
_COMPENSATION = "kahan_compensation."   # state_dict key prefix of the compensation buffers


class HalfWeights(MasterWeights):
    """A half model's weights, stepped through fp32 copies made for each optimizer step and written back by a rule.

        half = HalfWeights(to_half(model, torch.bfloat16), rounding="stochastic")
        opt = torch.optim.AdamW(half.params)                # or half.param_groups([...])
        ... loss.backward(); half.grads_to_master(); opt.step(); half.master_to_model()

    Per half parameter w with fp32 working copy m: m = float(w), m.grad = float(w.grad); the
    optimizer updates m; then u = m - float(w) and w <- rounding(w, u). Parameters that are already
    fp32 (norm layers kept fp32 by to_half) are their own working copy, as in MasterWeights.

    Args:
        model (nn.Module): a model whose weights are already half (to_half(model, torch.bfloat16)).
        rounding (str, default "kahan"): how the fp32 result is written back: "nearest" (w.add_(u)),
            "kahan" (a half compensation buffer per weight) or "stochastic" (bf16 weights only).
        generator (torch.Generator, optional): what "stochastic" draws from (default: torch's global one).
    """

    def __init__(self, model: nn.Module, rounding: str = "kahan", generator: torch.Generator | None = None):
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        super().__init__(model)
        if rounding == "stochastic" and any(p.dtype != torch.bfloat16 for p, _ in self.pairs):
            raise ValueError("rounding='stochastic' rounds fp32 to bf16 (bf16 is the top half of an fp32 number; "
                             "fp16 has no such shortcut): cast the model with to_half(model, torch.bfloat16), "
                             "or use rounding='kahan' for fp16")
        self.rounding = rounding
        self.generator = generator
        self.compensations = [torch.zeros_like(p) if rounding == "kahan" else None for p, _ in self.pairs]
        for _, m in self.pairs:
            m.data = m.data.new_empty(0)      # no fp32 copy between steps: that is the point

    def grads_to_master(self) -> None:
        """Make each working copy: m = float(w) and m.grad = float(w.grad) (skipped where w has no gradient)."""
        for p, m in self.pairs:
            if p.grad is None:
                m.grad = None
                continue
            m.data = p.detach().to(torch.float32)
            m.grad = p.grad.detach().to(torch.float32)

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Write each stepped working copy into its half weight by the rounding rule, then free the copy."""
        for (p, m), c in zip(self.pairs, self.compensations):
            if m.numel() == 0:                 # no gradient this step: the optimizer left it alone
                continue
            if self.rounding == "nearest":
                p.copy_(m)
            elif self.rounding == "stochastic":
                p.copy_(round_stochastic(m, self.generator))
            else:
                kahan_add_(p, m.sub_(p), c)    # the fp32 update u = m - w, made in m's own storage
            m.grad = None
            m.data = m.data.new_empty(0)

    def compensation_of(self, param: torch.Tensor) -> torch.Tensor | None:
        """A model parameter's Kahan compensation buffer (None unless rounding="kahan", and for fp32 or frozen ones)."""
        for (p, _), c in zip(self.pairs, self.compensations):
            if p is param:
                return c
        self.master_of(param)                  # raises for a tensor that is not the model's parameter
        return None

    def state_dict(self) -> dict[str, torch.Tensor]:
        """model.state_dict() (half weights: they are the only copy) plus the Kahan compensation buffers."""
        out = {name: t.detach().clone() for name, t in self.model.state_dict().items()}
        names = {id(p): name for name, p in self.model.named_parameters()}
        for (p, _), c in zip(self.pairs, self.compensations):
            if c is not None:
                out[_COMPENSATION + names[id(p)]] = c.clone()
        return out

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True):
        """Load a state_dict() checkpoint: the half weights as they are, and the compensation buffers."""
        weights = {k: v for k, v in state_dict.items() if not k.startswith(_COMPENSATION)}
        result = self.model.load_state_dict(weights, strict=strict)
        names = {id(p): name for name, p in self.model.named_parameters()}
        for (p, _), c in zip(self.pairs, self.compensations):
            key = _COMPENSATION + names[id(p)]
            if c is not None and key in state_dict:
                c.copy_(state_dict[key])
            elif c is not None and strict:
                raise ValueError(f"this checkpoint has no {key!r}: it was not saved from a HalfWeights with "
                                 f"rounding='kahan'; pass strict=False to start the compensation at zero")
        return result

    def __repr__(self) -> str:
        n = sum(p.numel() for p, _ in self.pairs)
        return f"HalfWeights({len(self.pairs)} half parameters ({n:,} values), rounding={self.rounding!r})"
