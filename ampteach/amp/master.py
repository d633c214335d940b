"""fp32 master weights: a half-precision model, trained through fp32 copies of its parameters.

    model = to_half(mlp())                         # fp16 weights; norm layers stay fp32
    master = MasterWeights(model)                  # fp32 copies of the fp16 parameters
    opt = torch.optim.AdamW(master.params, lr=1e-3)
    scaler = ampteach.GradScaler("cpu")
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)        # 1. fp16 forward (no autocast needed)
        opt.zero_grad(set_to_none=True); model.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()              # 2. fp16 grads of S * loss, on the model
        master.grads_to_master()                   # 3. fp32 copies of them, still times S
        scaler.step(opt); scaler.update()          # 4. unscale, skip on inf/NaN, update fp32
        master.master_to_model()                   # 5. round the fp32 weights back to fp16

This is Apex's O2 ("almost fp16") and fastai's 5-step loop. Why the copy: an fp16 weight w only
moves when |update| >= half an ulp of w, i.e. roughly when w / update < 2048 (2**11); smaller updates
round away and are lost for good, while the fp32 master accumulates them until they show in fp16.
It is also why torch.amp.GradScaler refuses fp16 gradients ("Attempting to unscale FP16
gradients."): the scaler unscales and steps the fp32 master gradients instead.
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch import nn

from ampteach.amp.containers import cast_tensors

__all__ = ["HALF_DTYPES", "NORM_LAYERS", "MasterWeights", "to_half"]

HALF_DTYPES = (torch.float16, torch.bfloat16)

# _NormBase: BatchNorm1d/2d/3d, SyncBatchNorm, InstanceNorm*; their statistics need fp32's range and precision.
NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm,
)

# module -> the cast hooks to_half registered on it (so a second to_half replaces them, not stacks them)
_CAST_HOOKS: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()


def to_half(model: nn.Module, dtype: torch.dtype = torch.float16, keep_norm_fp32: bool = True) -> nn.Module:
    """Cast model in place to a half dtype, like model.half(), and return it; norm layers stay fp32 if asked.

        model = to_half(cnn())                     # Apex O2's model: fp16 convs, fp32 BatchNorm
        logits = model(x)                          # x may be fp32: inputs are cast to fp16, logits to fp32

    Parameters and floating buffers become `dtype` (w_half = round(w)); integer buffers are left alone.
    So that the model runs without autocast, as Apex O2 did, floating inputs of the whole model are
    cast to `dtype` and its floating outputs to fp32 (the loss is computed in fp32), inside containers
    too, walked as torch.amp's custom_fwd walks them (ampteach.amp.containers). With
    keep_norm_fp32, every BatchNorm/InstanceNorm/LayerNorm/GroupNorm/RMSNorm keeps fp32 parameters
    and running statistics: the half activations are cast to fp32 on the way in (exact) and its
    output back to `dtype` on the way out, so the next half layer gets the dtype it expects.
    """
    if dtype not in HALF_DTYPES:
        raise ValueError(f"to_half casts to a 16-bit float (torch.float16 or torch.bfloat16), got {dtype}; "
                         f"for fp32 use model.float()")
    for module in model.modules():
        for handle in _CAST_HOOKS.pop(module, []):
            handle.remove()
    model.to(dtype)
    _cast_io(model, inputs=dtype, outputs=torch.float32)
    if keep_norm_fp32:
        for module in model.modules():
            if isinstance(module, NORM_LAYERS):
                module.float()
                _cast_io(module, inputs=torch.float32, outputs=dtype)
    return model


def _cast_io(module: nn.Module, inputs: torch.dtype, outputs: torch.dtype) -> None:
    """Hooks: cast the module's floating inputs to `inputs` before forward, its outputs to `outputs` after."""
    _CAST_HOOKS[module] = _CAST_HOOKS.get(module, []) + [
        module.register_forward_pre_hook(partial(_cast_inputs, inputs), with_kwargs=True),
        module.register_forward_hook(partial(_cast_output, outputs)),
    ]


def _cast_inputs(dtype, module, args, kwargs):
    cast = partial(_cast_floating, dtype)
    return cast_tensors(args, cast), cast_tensors(kwargs, cast)


def _cast_output(dtype, module, args, output):
    return cast_tensors(output, partial(_cast_floating, dtype))


def _cast_floating(dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


class MasterWeights:
    """fp32 master copies of a half model's trainable parameters: the optimizer updates these.

        master = MasterWeights(to_half(model))
        opt = torch.optim.AdamW(master.params)              # or master.param_groups([...])
        ... scaler.scale(loss).backward(); master.grads_to_master()
        scaler.step(opt); scaler.update(); master.master_to_model()

    Per half parameter w: m.grad = float32(w.grad); the optimizer updates m; w = round_half(m).
    Parameters that are already fp32 (norm layers kept fp32 by to_half) are their own master, as in
    Apex: no copy, and their gradients reach the optimizer directly. A frozen parameter
    (requires_grad=False) gets no copy either: param_groups passes it on as itself, as torch.optim
    keeps a frozen parameter in its group (it has no gradient, so no step changes it). Build it after
    moving the model to its device; the copies live beside the parameters. state_dict() is an fp32
    checkpoint.

    Args:
        model (nn.Module): the half model (to_half's); its trainable parameters get fp32 masters,
            in model.parameters() order (`params`, and `pairs` of (half parameter, fp32 copy)).
    """

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"MasterWeights(model) takes the nn.Module to train, got {type(model).__name__}; "
                            f"for a list of parameters, wrap them in an nn.Module (e.g. nn.ParameterList)")
        self.model = model
        self.params: list[torch.Tensor] = []      # what the optimizer gets, one per trainable parameter
        self.pairs: list[tuple[nn.Parameter, nn.Parameter]] = []  # (half model parameter, its fp32 copy)
        self._master_of: dict[int, torch.Tensor] = {}
        for p in model.parameters():
            if not p.requires_grad:
                self._master_of[id(p)] = p            # frozen: its own "master", never stepped (no grad)
                continue
            if p.dtype in HALF_DTYPES:
                m = nn.Parameter(p.detach().to(torch.float32))  # exact: every half value is an fp32 value
                self.pairs.append((p, m))
            else:
                m = p
            self.params.append(m)
            self._master_of[id(p)] = m
        if not self.params:
            raise ValueError("the model has no trainable parameters (none with requires_grad=True): "
                             "there is nothing to keep a master copy of")

    def grads_to_master(self) -> None:
        """Copy the model's half gradients (still times the loss scale) into the fp32 copies' .grad."""
        for p, m in self.pairs:
            m.grad = None if p.grad is None else p.grad.detach().to(torch.float32)

    @torch.no_grad()
    def master_to_model(self) -> None:
        """Write the updated fp32 values back into the half model, rounding each to nearest."""
        for p, m in self.pairs:
            p.copy_(m)

    def master_of(self, param: torch.Tensor) -> torch.Tensor:
        """The tensor the optimizer gets for this model parameter (itself when it is fp32 or frozen)."""
        try:
            return self._master_of[id(param)]
        except KeyError:
            raise ValueError(
                f"a {tuple(param.shape)} {param.dtype} tensor is not a parameter of the model this "
                f"MasterWeights was built from; pass the model's own parameters (model.parameters())"
            ) from None

    def param_groups(self, groups) -> list[dict]:
        """Optimizer param groups over the master copies, from groups written with model parameters.

            opt = torch.optim.AdamW(master.param_groups([
                {"params": model[1].parameters(), "weight_decay": 0.1},
                {"params": model[3].parameters(), "lr": 1e-4},
            ]), lr=1e-3)
            opt = torch.optim.AdamW(master.param_groups(model.named_parameters()))   # names kept
        Takes what torch.optim takes (parameters, (name, parameter) pairs, dicts with "params" and
        options; a plain iterable makes one group) and refuses what it refuses, with its exception types.
        A frozen parameter stays in its group as itself, as torch.optim keeps it (model.named_parameters()
        of a partly frozen model works); a tensor that is not a parameter of the model is refused.
        """
        if isinstance(groups, torch.Tensor):
            raise TypeError("param_groups() takes an iterable of parameters or of dicts (as torch.optim does), "
                            f"got a single {torch.typename(groups)}: wrap it in a list")
        groups = list(groups)
        if not groups:
            raise ValueError("param_groups() got an empty parameter list (torch.optim refuses one too)")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        return [self._master_group(group) for group in groups]

    def _master_group(self, group) -> dict:
        """One param group with every model parameter (or (name, parameter) pair) replaced by its master."""
        if not isinstance(group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(group)}: once one group is a dict "
                            "{'params': ...}, every element of the list must be one")
        params = group["params"]
        if isinstance(params, torch.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        masters = [(p[0], self._master_of_param(p[1])) if isinstance(p, tuple) else self._master_of_param(p)
                   for p in params]
        return {**group, "params": masters}

    def _master_of_param(self, param) -> torch.Tensor:
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {torch.typename(param)}")
        return self.master_of(param)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of model.state_dict() with the fp32 master values in place of the half parameters.

        Every floating tensor in it is fp32 (half buffers are upcast, exactly), so it also loads into
        an fp32 copy of the model. Save it, not model.state_dict(): a half checkpoint has already lost
        the low bits the master copy keeps (the textbook's pitfall 5).
        """
        out = {}
        for name, t in self.model.state_dict(keep_vars=True).items():
            t = self._master_of.get(id(t), t).detach()
            out[name] = t.to(torch.float32) if t.dtype in HALF_DTYPES else t.clone()
        return out

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True):
        """Load a state_dict() checkpoint: exact fp32 masters, and the model set to their rounded values."""
        for name, t in state_dict.items():
            if isinstance(t, torch.Tensor) and t.dtype in HALF_DTYPES:
                raise ValueError(
                    f"{name!r} in this checkpoint is {t.dtype}: a half checkpoint (model.state_dict() of the "
                    f"half model) has lost the master copy's low bits. Load the fp32 checkpoint written by "
                    f"MasterWeights.state_dict(), or an fp32 model's state_dict()"
                )
        result = self.model.load_state_dict(state_dict, strict=strict)  # half params = round(fp32 values)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                m = self._master_of.get(id(p))
                if m is not None and m is not p and name in state_dict:
                    m.copy_(state_dict[name])
        return result

    def __repr__(self) -> str:
        n_copied = sum(m.numel() for _, m in self.pairs)
        return (f"MasterWeights({len(self.pairs)} fp32 copies of half parameters ({n_copied:,} values), "
                f"{len(self.params) - len(self.pairs)} fp32 parameters as their own master)")
