"""One walk through nested containers: apply a cast to every tensor inside, as torch.amp's custom_fwd does.

    cast_tensors({"x": x, "pair": (a, b)}, torch.Tensor.float)   # {'x': x.float(), 'pair': (a.float(), b.float())}
    cast_tensors({a, b}, torch.Tensor.half)                       # a generator: (a.half(), b.half()), as torch's

value -> the same structure with cast(t) in place of every tensor t, by the rules of torch's `_cast`
(torch/amp/autocast_mode.py), which custom_fwd(cast_inputs=...) applies to a forward's arguments:

    tensor                          cast(tensor)
    str, bytes, numpy array         unchanged (iterable, but not containers of tensors)
    any Mapping                     a dict, keys and values walked (dict, OrderedDict, MappingProxyType...)
    list, tuple                     the same type, items walked
    namedtuple                      the same namedtuple, field by field (torch's _cast raises TypeError here)
    any other iterable              a generator over the walked items (set, deque, dict views, generators...)
    anything else                   unchanged

The cast decides which tensors change (custom_fwd: floating, on the region's device, not float64;
to_half's hooks: every floating tensor). ampteach.amp.autocast's custom_fwd and
ampteach.amp.master's to_half both walk their containers here.
"""

from __future__ import annotations

import collections.abc
import sys
from typing import Any, Callable

import torch

__all__ = ["cast_tensors"]


def cast_tensors(value: Any, cast: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """`value` with `cast` applied to every tensor in it, walking containers as torch.amp's _cast does.

        cast_tensors((x, [y, 3], {"z": z}), torch.Tensor.float)   # (x.float(), [y.float(), 3], {'z': z.float()})

    Generators are lazy, as torch's: an iterable that is not a list, a tuple or a mapping comes back
    as a generator whose items are cast when it is consumed.
    """
    if isinstance(value, torch.Tensor):
        return cast(value)
    if isinstance(value, (str, bytes)) or _is_ndarray(value):
        return value
    if isinstance(value, collections.abc.Mapping):
        return {cast_tensors(k, cast): cast_tensors(v, cast) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):      # a namedtuple: rebuilt from its fields
        return type(value)(*(cast_tensors(v, cast) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_tensors(v, cast) for v in value)
    if isinstance(value, collections.abc.Iterable):
        return (cast_tensors(v, cast) for v in value)
    return value


def _is_ndarray(value: Any) -> bool:
    """Whether value is a numpy array (numpy is only looked for if something has imported it)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)
