"""ampteach.amp.containers: one container walk, used by custom_fwd(cast_inputs=...) and to_half's hooks.

custom_fwd(cast_inputs=...) against torch.amp.custom_fwd: the same arguments, in every kind of
container torch's _cast (torch/amp/autocast_mode.py) reaches, must arrive in forward with the same
structure and dtypes. Hypothesis builds nested containers; fixed cases name each kind.
"""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ampteach
from ampteach.amp.containers import cast_tensors
from ampteach.amp.master import to_half

BF16, FP16, FP32, FP64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
Pair = collections.namedtuple("Pair", "first second")


def describe(value):
    """Structure and dtypes, consuming generators: what forward received, comparable across runs."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.device.type)
    if isinstance(value, (str, bytes, int, float)) or value is None:
        return value
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str)
    if isinstance(value, collections.abc.Mapping):
        return (type(value).__name__, [(describe(k), describe(v)) for k, v in value.items()])
    if isinstance(value, collections.abc.Iterable):
        return (type(value).__name__, [describe(v) for v in value])
    return (type(value).__name__,)


def received_under(module, region, cast_inputs, *args, **kwargs):
    """What forward receives (described) when called inside `region` through module.custom_fwd."""
    seen = []

    @module.custom_fwd(device_type="cpu", cast_inputs=cast_inputs)
    def forward(ctx, *args, **kwargs):
        seen.append((describe(args), describe(kwargs), torch.is_autocast_enabled("cpu")))

    try:
        with region("cpu", dtype=BF16):
            forward(types.SimpleNamespace(), *args, **kwargs)   # a Function's forward, called as apply would
    except Exception as exc:   # the error is the result: both must raise the same type
        return type(exc)
    return seen[0]


def both(make_args, cast_inputs=FP32):
    """(torch's result, ampteach's): the arguments are built afresh for each (generators are consumed)."""
    theirs = received_under(torch.amp, torch.autocast, cast_inputs, *make_args())
    ours = received_under(ampteach, ampteach.autocast, cast_inputs, *make_args())
    return theirs, ours


def t(dtype=BF16):
    return torch.ones(2, dtype=dtype)


CASES = {
    "tensor": lambda: (t(),),
    "list and tuple": lambda: ([t(), (t(), 1)],),
    "dict with tensor keys": lambda: ({"a": t(), t(): t(FP64)},),
    "OrderedDict": lambda: (collections.OrderedDict(x=t()),),
    "MappingProxyType": lambda: (types.MappingProxyType({"x": t()}),),
    "dict views": lambda: ({"k": t()}.values(), {"k": t()}.items(), {t(): 1}.keys()),
    "deque": lambda: (collections.deque([t(), t(FP16)]),),
    "set and frozenset": lambda: ({t()}, frozenset({t()})),
    "generator": lambda: ((x for x in (t(), t(FP16))),),
    "range, str, bytes": lambda: (range(3), "text", b"bytes"),
    "numpy array": lambda: (np.ones(2, dtype=np.float16),),
    "fp64, integers, bool": lambda: (t(FP64), torch.arange(3), torch.ones(2, dtype=torch.bool)),
    "nested": lambda: ([{"a": collections.deque([(t(), {t(FP16)})])}],),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("cast_inputs", [FP32, FP16], ids=["to-fp32", "to-fp16"])
def test_custom_fwd_casts_every_container_as_torchs(case, cast_inputs):
    theirs, ours = both(CASES[case], cast_inputs)
    assert theirs == ours
    assert not isinstance(theirs, type), theirs     # every case runs in torch


def test_keyword_arguments_are_cast_too():
    theirs = received_under(torch.amp, torch.autocast, FP32, t(), scale=[t()], note="x")
    ours = received_under(ampteach, ampteach.autocast, FP32, t(), scale=[t()], note="x")
    assert theirs == ours and theirs[1] == ("dict", [("scale", ("list", [("tensor", FP32, "cpu")])), ("note", "x")])


def test_a_namedtuple_keeps_its_type_where_torchs_raises():
    """torch's _cast calls type(value)(generator), which a namedtuple refuses; ampteach rebuilds it field by field."""
    theirs, ours = both(lambda: (Pair(t(), t()),))
    assert theirs is TypeError
    assert ours[0] == ("tuple", [("Pair", [("tensor", FP32, "cpu"), ("tensor", FP32, "cpu")])])


tensors = st.sampled_from([BF16, FP16, FP32, FP64, torch.int64]).map(lambda d: torch.ones(1, dtype=d))
leaves = tensors | st.integers(-3, 3) | st.text(max_size=3)
containers = st.recursive(leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=2), inner, max_size=3),
    st.lists(inner, max_size=3).map(collections.deque)), max_leaves=8)


@settings(max_examples=40, deadline=None)
@given(containers)
def test_nested_containers_arrive_as_with_torch(value):
    theirs, ours = both(lambda: (value,))
    assert theirs == ours


def test_cast_tensors_reaches_every_tensor_and_nothing_else():
    out = cast_tensors({"a": [t(), 3, "s"], "b": (t(FP64),)}, torch.Tensor.float)
    assert describe(out) == ("dict", [("a", ("list", [("tensor", FP32, "cpu"), 3, "s"])),
                                      ("b", ("tuple", [("tensor", FP32, "cpu")]))])


def test_to_half_casts_inputs_and_outputs_in_containers():
    """to_half's hooks walk containers with the same walk: a dict in, a namedtuple out."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, batch):
            seen.append(describe(batch))
            h = self.lin(batch["x"])
            return Pair(h, [h, batch["ids"]])

    seen: list = []
    out = to_half(Net())({"x": torch.ones(1, 2), "ids": torch.arange(2), "extra": collections.deque([t(FP64)])})
    assert seen == [("dict", [("x", ("tensor", FP16, "cpu")), ("ids", ("tensor", torch.int64, "cpu")),
                              ("extra", ("generator", [("tensor", FP16, "cpu")]))])]
    assert describe(out) == ("Pair", [("tensor", FP32, "cpu"), ("list", [("tensor", FP32, "cpu"),
                                                                          ("tensor", torch.int64, "cpu")])])
