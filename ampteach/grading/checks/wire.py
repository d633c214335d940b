"""The messages between a judge and the learner's process: values (tensors included) as length-prefixed JSON.

    send(stream, {"op": "call", "ref": "round_to_bf16", "args": [x]})   # x a tensor: its dtype, shape, bytes
    message = receive(stream)                                             # the same structure, tensors rebuilt

Both sides speak it: the judge (trusted) and the driver in the learner's kernel or sandbox (not). So
decoding never runs code: no pickle, only JSON, with a closed list of tagged values ({"$": "tensor",
...}, "tuple", "dtype", ...) checked as they are rebuilt: a dtype must be one of torch's, a tensor's
bytes must be exactly dtype size x number of elements, a message at most MAX_MESSAGE bytes. A value of
any other type travels as its type's name and a short repr (`Opaque`), so a judge can say what came
back without ever holding the object. An exception travels as `RemoteError` (its type's name and
message), never re-raised as the learner's type.

The framing: 8 bytes of big-endian length, then that many bytes of UTF-8 JSON.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

__all__ = ["MAX_MESSAGE", "WireError", "RemoteError", "Opaque", "encode", "decode", "send", "receive", "DTYPES"]

MAX_MESSAGE = 1 << 28          # 256 MiB: a learner's process cannot make the judge read more
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
    torch.bool, torch.complex64, torch.complex128)}
for _name in ("float8_e8m0fnu", "float4_e2m1fn_x2", "uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)


class WireError(ValueError):
    """A message that is not one of the protocol's: too long, cut short, or not the tagged JSON it should be."""


def _name(kind: type) -> str:
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


@dataclass(frozen=True)
class RemoteError:
    """An exception raised in the other process: its type's name (module-qualified for non-builtins) and message."""
    type: str
    message: str
    traceback: str = ""
    kinds: tuple[str, ...] = ()     # the type's own name and its bases' (isinstance, by name)

    @classmethod
    def of(cls, exc: BaseException, traceback: str = "") -> RemoteError:
        kind = type(exc)
        try:
            message = str(exc)
        except Exception:  # a learner's exception whose __str__ fails still travels
            message = f"<{kind.__name__} whose message could not be read>"
        return cls(_name(kind), message[:20_000], traceback[-20_000:], tuple(_name(k) for k in kind.__mro__))

    def isinstance(self, kind: type) -> bool:
        """Whether the remote exception was an instance of `kind` (compared by qualified name)."""
        return _name(kind) in (self.kinds or (self.type,))

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    def __str__(self) -> str:
        return f"{self.short_type}: {self.message}" if self.message else self.short_type


@dataclass(frozen=True)
class Opaque:
    """A value that does not travel (a module, a model, a lambda): its type's name and a short repr."""
    type: str
    repr: str

    def __repr__(self) -> str:
        return self.repr


def _tensor(t: torch.Tensor) -> dict:
    t = t.detach()
    out = {"$": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
           "rg": bool(getattr(t, "requires_grad", False)), "param": isinstance(t, torch.nn.Parameter)}
    if t.device.type == "meta" or type(t).__name__ == "FakeTensor" or t.device.type not in ("cpu", "cuda", "mps"):
        out["data"] = None                       # a tensor without values (fake CUDA tensors): dtype and shape only
        out["device"] = t.device.type
        return out
    t = t.cpu().contiguous().reshape(-1)
    raw = t.view(torch.uint8) if t.dtype.itemsize > 0 and t.numel() else torch.empty(0, dtype=torch.uint8)
    out["data"] = base64.b64encode(raw.numpy().tobytes()).decode("ascii")
    return out


def encode(value: Any, _depth: int = 0) -> Any:
    """A JSON-ready form of value (see the module docstring for what travels)."""
    if _depth > 64:
        raise WireError("a value nested more than 64 levels deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if type(value) is int else int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$": "float", "v": repr(float(value))}
    if isinstance(value, torch.Tensor):
        return _tensor(value)
    if isinstance(value, torch.dtype):
        return {"$": "dtype", "v": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$": "device", "v": str(value)}
    if isinstance(value, list):
        return [encode(v, _depth + 1) for v in value]
    if isinstance(value, tuple):                  # torch.Size and namedtuples too
        return {"$": "tuple", "v": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "v": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    if value is Ellipsis:
        return {"$": "ellipsis"}
    if isinstance(value, BaseException):
        value = RemoteError.of(value)
    if isinstance(value, RemoteError):
        return {"$": "error", "type": value.type, "message": value.message, "tb": value.traceback,
                "kinds": list(value.kinds)}
    if isinstance(value, Opaque):
        return {"$": "opaque", "type": value.type, "repr": value.repr}
    if hasattr(value, "item") and hasattr(value, "dtype") and getattr(value, "shape", None) == ():
        return encode(value.item(), _depth + 1)   # a numpy scalar
    if type(value).__module__ == "numpy" and hasattr(value, "shape"):
        return _tensor(torch.from_numpy(value.copy()))
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return {"$": "opaque", "type": type(value).__name__, "repr": text[:300]}


def _need(condition: bool, what: str) -> None:
    if not condition:
        raise WireError(what)


def _decode_tensor(obj: dict) -> torch.Tensor:
    dtype = DTYPES.get(obj.get("dtype"))
    shape = obj.get("shape")
    _need(dtype is not None, f"unknown dtype {obj.get('dtype')!r}")
    _need(isinstance(shape, list) and all(type(n) is int and 0 <= n < 1 << 40 for n in shape), "a bad tensor shape")
    numel = math.prod(shape)
    if obj.get("data") is None:
        _need(numel < 1 << 34, "a tensor too large")
        t = torch.empty(shape, dtype=dtype, device="meta")
    else:
        _need(isinstance(obj["data"], str), "tensor data must be base64 text")
        raw = base64.b64decode(obj["data"], validate=True)
        _need(len(raw) == numel * dtype.itemsize, f"{len(raw)} bytes for {numel} values of {dtype}")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    if obj.get("param") is True and t.is_floating_point():
        return torch.nn.Parameter(t, requires_grad=bool(obj.get("rg")))
    if obj.get("rg") is True and t.is_floating_point() and t.device.type != "meta":
        t.requires_grad_(True)
    return t


def decode(obj: Any, _depth: int = 0) -> Any:
    """The value an encoded form stands for; WireError for anything that is not one."""
    _need(_depth <= 66, "a value nested too deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode(v, _depth + 1) for v in obj]
    _need(isinstance(obj, dict) and isinstance(obj.get("$"), str), f"not a tagged value: {str(obj)[:80]}")
    tag = obj["$"]
    if tag == "tensor":
        return _decode_tensor(obj)
    if tag == "float":
        _need(obj.get("v") in ("nan", "inf", "-inf"), "a bad float")
        return float(obj["v"])
    if tag == "tuple":
        _need(isinstance(obj.get("v"), list), "a bad tuple")
        return tuple(decode(v, _depth + 1) for v in obj["v"])
    if tag == "dict":
        _need(isinstance(obj.get("v"), list) and all(isinstance(p, list) and len(p) == 2 for p in obj["v"]),
              "a bad dict")
        out = {}
        for k, v in obj["v"]:
            key = decode(k, _depth + 1)
            _need(isinstance(key, (str, int, float, bool, tuple, type(None))) or isinstance(key, torch.dtype),
                  "a dict key that cannot be one")
            out[key] = decode(v, _depth + 1)
        return out
    if tag == "dtype":
        _need(obj.get("v") in DTYPES, f"unknown dtype {obj.get('v')!r}")
        return DTYPES[obj["v"]]
    if tag == "device":
        _need(obj.get("v") in ("cpu", "cuda", "meta", "mps") or str(obj.get("v")).startswith("cuda:"), "a bad device")
        return torch.device(obj["v"])
    if tag == "ellipsis":
        return Ellipsis
    if tag == "error":
        kinds = obj.get("kinds") if isinstance(obj.get("kinds"), list) else []
        return RemoteError(str(obj.get("type"))[:200], str(obj.get("message"))[:20_000],
                           str(obj.get("tb", ""))[-20_000:], tuple(str(k)[:200] for k in kinds[:50]))
    if tag == "opaque":
        return Opaque(str(obj.get("type"))[:200], str(obj.get("repr"))[:300])
    raise WireError(f"unknown tag {tag!r}")


def send(stream: BinaryIO, message: Any) -> None:
    data = json.dumps(encode(message), allow_nan=False, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise WireError(f"a message of {len(data):,} bytes is over the {MAX_MESSAGE:,}-byte limit")
    stream.write(len(data).to_bytes(8, "big") + data)
    stream.flush()


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the other side closed the channel ({n - left} of {n} bytes read)")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(stream: BinaryIO, limit: int = MAX_MESSAGE) -> Any:
    """The next message; EOFError when the other side has gone, WireError when it sent something else."""
    n = int.from_bytes(_read_exactly(stream, 8), "big")
    if n > limit:
        raise WireError(f"a message of {n:,} bytes is over the {limit:,}-byte limit")
    try:
        return decode(json.loads(_read_exactly(stream, n).decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WireError(f"not a protocol message: {exc}") from None
