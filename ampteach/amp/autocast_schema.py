"""An autocast kernel's view of its op: which arguments it casts, and how it calls the op again.

    op = overload("cross_entropy_loss")        # torch.ops.aten.cross_entropy_loss.default
    slots(op)                                  # [Slot(0, 'self', ...), Slot(1, 'target', ...), Slot(2, 'weight', ...)]
    call_of("cross_entropy_loss", op)          # Call(torch._C._nn.cross_entropy_loss, (None, 1, -100, 0.0), {})

Read from the op's schema, once per op, when ampteach.amp.autocast_kernels builds its kernels: the
tensor arguments torch's C++ wrapper casts (Tensor, Tensor? and Tensor[]), and the fastest way back
into the dispatcher with every argument given.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

__all__ = ["BINDINGS", "Call", "Slot", "call_of", "overload", "slots"]


def overload(name: str) -> torch._ops.OpOverload:
    """'softmax.int' -> torch.ops.aten.softmax.int; 'linear' -> torch.ops.aten.linear.default."""
    base, _, variant = name.partition(".")
    return getattr(getattr(torch.ops.aten, base), variant or "default")


class Slot(NamedTuple):
    """An argument torch's wrapper casts: a Tensor, a Tensor? or a Tensor[] (not a Tensor?[])."""

    index: int              # in the schema
    name: str
    keyword: bool           # keyword-only: the kernel receives it in kwargs
    is_list: bool
    optional: bool          # Tensor?: cast, but left out of promote's choice of dtype (as in torch)


def slots(op: torch._ops.OpOverload) -> list[Slot]:
    """The op's tensor arguments in schema order (a Tensor?[] is not cast, as in torch)."""
    found = []
    for i, arg in enumerate(op._schema.arguments):
        kind = inner = arg.type
        optional = isinstance(kind, torch._C.OptionalType)
        if optional:
            inner = kind.getElementType()
        is_list = isinstance(inner, torch._C.ListType) and not optional
        if is_list:
            inner = inner.getElementType()
        if isinstance(inner, torch._C.TensorType):
            found.append(Slot(i, arg.name, arg.kwarg_only, is_list, optional))
    return found


# The course's hot ops, called through their Python bindings, which parse arguments faster than the
# generic torch.ops call. A binding may have other defaults than the schema (torch._C._nn.
# cross_entropy_loss defaults to no reduction), and a Python kernel receives its arguments with the
# trailing defaults left out, so every argument is passed explicitly. With all arguments given, each
# binding resolves to the overload registered (tests compare dispatch traces and bits with torch's).
_VF, _NN = torch._C._VariableFunctions, torch._C._nn
BINDINGS: dict[str, Callable] = {
    "linear": _NN.linear, "mm": _VF.mm, "addmm": _VF.addmm, "bmm": _VF.bmm, "baddbmm": _VF.baddbmm,
    "matmul": _VF.matmul, "conv1d": _VF.conv1d, "conv2d": _VF.conv2d, "conv3d": _VF.conv3d,
    "cross_entropy_loss": _NN.cross_entropy_loss, "nll_loss": _NN.nll_loss, "softmax.int": _VF.softmax,
    "log_softmax.int": _VF.log_softmax, "layer_norm": _VF.layer_norm,
}


class Call(NamedTuple):
    """How a kernel calls its op again: fn(*args, *pad[len(args):], **(keywords | kwargs))."""

    fn: Callable
    pad: tuple              # positional defaults (all of them for a binding, none for op._op)
    keywords: dict          # keyword-only defaults (a binding's), else empty


def call_of(name: str, op: torch._ops.OpOverload) -> Call:
    """How a kernel for `name` calls `op` again: its Python binding with every default, else op._op."""
    binding = BINDINGS.get(name)
    if binding is None:      # op._op: what OpOverload.__call__ calls; it fills in omitted defaults itself
        return Call(op._op, (), {})
    arguments = op._schema.arguments
    return Call(binding, tuple(a.default_value for a in arguments if not a.kwarg_only),
                {a.name: a.default_value for a in arguments if a.kwarg_only})
