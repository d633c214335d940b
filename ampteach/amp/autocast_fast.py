"""The hot path of ampteach's autocast kernels: one function written out per op, from its schema.

    kernel = fast_cast_kernel("cpu", "linear", "lower_precision_fp", order, special, thread)
    kernel(x, weight, bias)          # what the dispatcher calls at AutocastCPU inside a region
    print(kernel.source)             # the generated Python, to read

A region's ops that cast (lower_precision_fp, fp32) with only positional tensor arguments (linear,
mm, conv2d, cross_entropy_loss: nearly every op a model calls) get this kernel; the others, and every
call made while recording or under a torch function mode, go to the generic kernel (`special`). Per
tensor argument t it does what ampteach.amp.autocast_cache.caster does:

    t -> t                      if t is not floating, float64, on another device, or already `to`
    t -> cache[t]               an fp32 leaf that requires grad, while the region's cache is on
    t -> t.to(to)               otherwise (and a cast it cached is kept)

written out one argument at a time: named parameters instead of an argument list, the device test and
the cache lookup inline, the op called again through its Python binding with every argument given.
The rule is the generic kernel's; only the bookkeeping is cheaper. A Python kernel pays per call what
running Python costs (benchmarks/README.md counts the instructions), so in a small model's training
step these lines are the whole of ampteach's overhead against torch's C++ kernels.
"""

from __future__ import annotations

from typing import Callable

import torch

from ampteach.amp import autocast_schema as schema
from ampteach.amp.autocast_cache import ARMED, CACHE, CONVERTERS, arm, cached_cast, converter, lookup

__all__ = ["fast_cast_kernel"]

_F32, _F64 = torch.float32, torch.float64
_DEVICE_KEYS = {"cpu": torch._C.DispatchKey.AutocastCPU, "cuda": torch._C.DispatchKey.AutocastCUDA}
_ON_DEVICE = {"cpu": "({a}.is_cpu or {a}.is_mkldnn)", "cuda": "{a}.is_cuda"}   # autocast_cache.on_device

_KERNEL = """
def kernel({params}, **kwargs):
    if kwargs or thread.recorders or modes_on():     # keywords, recording, a torch function mode: the generic way
        return special(({names},){rest}, kwargs)
{choose}
    exclude(key, True)      # below this kernel's Autocast key, as torch's wrapper
    try:
{casts}
        return {call}
    finally:
        exclude(key, False)
"""
_CHOOSE = {
    "lower_precision_fp": "    to = get_dtype(device)\n    convert = CONVERT.get(to) or converter(to)\n"
                          "    cache = cache_enabled() and not inference()",
    "fp32": "    convert = to_float",
}
_CAST = {   # one tensor argument {a}; {on_device} is the device test written out
    "lower_precision_fp": """\
        dtype = {a}.dtype
        if dtype is not to and (dtype is F32 or dtype.is_floating_point and dtype is not F64) and {on_device}:
            if cache and dtype is F32 and {a}.requires_grad and {a}.is_leaf:     # a weight: the cache
                hit = lookup(id({a}))
                if hit is None and grad_on() and not {a}._is_view() and not is_cached({a}):
                    hit = CACHE[id({a})] = {a}, convert({a})     # first use in the region: cast and keep
                    {a} = hit[1]
                    if not ARMED:                           # tie the cache to torch's (autocast_cache.arm)
                        arm()
                elif hit is not None and hit[0] is {a} and not is_cached({a}):
                    {a} = hit[1]
                else:                                       # the rare cases: autocast_cache.cached_cast
                    {a} = cached_cast({a}, convert)
            else:
                {a} = convert({a})
""",
    "fp32": """\
        dtype = {a}.dtype
        if dtype is not F32 and dtype.is_floating_point and dtype is not F64 and {on_device}:
            {a} = convert({a})
""",
}


def fast_cast_kernel(device: str, name: str, policy: str, order: list[schema.Slot], special: Callable,
                     thread) -> Callable | None:
    """The generated kernel for `name`, or None where it does not apply (then the generic kernel serves).

    `order` lists the tensor arguments in the order torch's build casts them; `special(args, kwargs)`
    is the generic kernel, and `thread.recorders` the calling thread's recording regions.
    """
    op = schema.overload(name)
    arguments = op._schema.arguments
    if policy not in _CHOOSE or any(slot.keyword or slot.is_list for slot in order):
        return None
    fn, pad, keywords = schema.call_of(name, op)
    binding = name in schema.BINDINGS        # every argument given explicitly (its defaults may differ)
    count = len(pad) if binding else max(slot.index for slot in order) + 1
    if any(arguments[i].kwarg_only or (arguments[i - 1].has_default_value() and not arguments[i].has_default_value())
           for i in range(1, count)):
        return None
    names = ", ".join(f"a{i}" for i in range(count))
    defaults = {f"d{i}": arguments[i].default_value for i in range(count) if arguments[i].has_default_value()}
    params = ", ".join(f"a{i}=d{i}" if f"d{i}" in defaults else f"a{i}" for i in range(count))
    if binding:
        call = f"call({names}{''.join(f', {k}=k_{k}' for k in keywords)})"
        rest = ""
    else:
        params, call, rest = params + ", *rest", f"call({names}, *rest)", " + rest"
    casts = []
    for slot in order:
        a = f"a{slot.index}"
        cast = _CAST[policy].format(a=a, on_device=_ON_DEVICE[device].format(a=a))
        if slot.optional:
            cast = f"        if {a} is not None:\n" + "".join(f"    {line}\n" for line in cast.splitlines())
        casts.append(cast)
    source = _KERNEL.format(params=params, names=names, rest=rest, choose=_CHOOSE[policy], call=call,
                            casts="".join(casts).rstrip("\n"))
    namespace = dict(defaults, **{f"k_{k}": v for k, v in keywords.items()}, thread=thread, special=special,
                     modes_on=torch._C._is_torch_function_mode_enabled, F32=_F32, F64=_F64, device=device,
                     get_dtype=torch.get_autocast_dtype, cache_enabled=torch.is_autocast_cache_enabled,
                     inference=torch.is_inference_mode_enabled, grad_on=torch.is_grad_enabled,
                     CONVERT=CONVERTERS, converter=converter, to_float=CONVERTERS[_F32], CACHE=CACHE, lookup=lookup,
                     ARMED=ARMED, arm=arm,
                     cached_cast=cached_cast, is_cached=torch._C._is_cached_tensor, key=_DEVICE_KEYS[device],
                     exclude=torch._C._dispatch_tls_set_dispatch_key_excluded, call=fn)
    exec(compile(source, f"<ampteach autocast kernel {device} {name}>", "exec"), namespace)
    kernel = namespace["kernel"]
    kernel.source = source
    return kernel
