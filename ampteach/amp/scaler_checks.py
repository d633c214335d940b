"""GradScaler's argument checks and misuse messages: what torch refuses, refused alike; what cannot be meant, warned.

    from ampteach.amp.scaler_checks import check_factors, check_growth_interval, warn_if_surely_wrong
    check_factors(growth_factor=2.0, backoff_factor=0.5)   # AssertionError where torch raises one
    check_growth_interval(2000)                             # TypeError / ValueError where torch's kernel refuses
    warn_if_surely_wrong(init_scale=0.0)                    # UserWarning: accepted by torch, but surely a mistake

Each check raises the exception type torch raises for the same input (tests/test_scaler_dropin.py
compares them), with a message that says what was passed and what to pass instead; the messages for
calls made out of order (UNSCALED_TWICE, STEPPED_TWICE, ...) live here too. Values torch accepts run
as in torch; where one cannot be meant (a scale of 0, a growth factor of 1), a UserWarning says what
it will do. ampteach/amp/scaler.py calls these; they hold no state."""

from __future__ import annotations

import math
import operator
import warnings

import torch

__all__ = ["FIX", "NO_GRADS", "NO_STEP_BEFORE_UPDATE", "PASSES_ITSELF", "PICKLED_MID_ITERATION", "STEPPED_TWICE",
           "UNSCALED_TWICE", "UNSCALE_AFTER_STEP", "check_factors", "check_growth_interval", "check_new_scale",
           "check_state_dict", "init_scale_overflows", "missing_attribute", "warn_if_surely_wrong", "SCALING_STATE"]

FLOAT32_MAX = torch.finfo(torch.float32).max
FIX = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
_NEW_SCALE = ("new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
              "torch.FloatTensor with requires_grad=False.")
# misuse of the calls, in the order of a training step (the exception types are torch's)
UNSCALED_TWICE = ("unscale_() has already been called on this optimizer since the last update(). Call it once "
                  "per iteration, after the last backward() (with gradient accumulation: only in the iteration "
                  "that steps), right before clipping and step().")
UNSCALE_AFTER_STEP = ("unscale_() is being called after step(). step() already unscaled the gradients; call "
                      "unscale_() before step(), or update() first to start the next iteration.")
STEPPED_TWICE = ("step() has already been called since the last update(). Call scaler.update() once per "
                 "iteration, after stepping every optimizer.")
NO_GRADS = ("No inf checks were recorded for this optimizer. None of its parameters has a .grad: call "
            "scaler.scale(loss).backward() before step(), on a loss that depends on them.")
NO_STEP_BEFORE_UPDATE = ("No inf checks were recorded prior to update(). Call scaler.step(optimizer) (or "
                         "scaler.unscale_(optimizer)) on every optimizer before update().")
PICKLED_MID_ITERATION = ("A GradScaler instance may only be pickled at the beginning of an iteration, or at the "
                         "end after scaler.update().")
PASSES_ITSELF = ("GradScaler is going to stop passing itself as a keyword argument to the passed optimizer. In "
                 "the near future GradScaler registers `grad_scale: Tensor` and `found_inf: Tensor` to the "
                 "passed optimizer and let the optimizer use them directly.")
_USUAL = "The usual values are init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000."


def check_factors(growth_factor: float, backoff_factor: float) -> None:
    """torch's two checks on an enabled GradScaler's factors (AssertionError, as torch raises)."""
    if growth_factor <= 1.0:
        raise AssertionError(f"The growth factor must be > 1.0, got growth_factor={growth_factor!r}: the "
                             "scale grows by it after growth_interval clean steps. The usual value is 2.0.")
    if backoff_factor >= 1.0:
        raise AssertionError(f"The backoff factor must be < 1.0, got backoff_factor={backoff_factor!r}: the "
                             "scale shrinks by it after an inf/NaN gradient. The usual value is 0.5.")


def check_growth_interval(growth_interval) -> int:
    """torch passes growth_interval to a kernel that takes a 64-bit int: refuse what it refuses, as it does."""
    if isinstance(growth_interval, bool):
        raise TypeError(f"growth_interval must be an int (clean steps before the scale grows), "
                        f"got {growth_interval!r}")
    try:
        interval = operator.index(growth_interval)
    except TypeError:
        raise TypeError(f"growth_interval must be an int (clean steps before the scale grows), got "
                        f"{type(growth_interval).__name__} {growth_interval!r}; e.g. growth_interval=2000") from None
    if not -2**63 <= interval < 2**63:
        raise ValueError(f"growth_interval={interval} does not fit in a 64-bit int; the usual value is 2000")
    return interval


def check_new_scale(new_scale, device_type: str) -> None:
    """update(new_scale=t) with a tensor t: torch's checks, with its exception types, before S is overwritten."""
    if not isinstance(new_scale, torch.Tensor):   # torch fails reading new_scale.device: AttributeError
        raise AttributeError(f"{_NEW_SCALE} Got {type(new_scale).__name__} {new_scale!r}: pass a Python "
                             "float (update(new_scale=float(x))) or a 0-d float tensor on the scale's device.")
    if new_scale.device.type != device_type or new_scale.numel() != 1 or new_scale.requires_grad:
        raise AssertionError(f"{_NEW_SCALE} Got a tensor of shape {tuple(new_scale.shape)} on "
                             f"{new_scale.device} with requires_grad={new_scale.requires_grad}.")
    if new_scale.dim() != 0:   # torch's copy_ into the 0-d scale refuses it
        raise RuntimeError(f"new_scale has shape {tuple(new_scale.shape)}, but the scale is a 0-d tensor "
                           "(output with shape [] doesn't match the broadcast shape): pass new_scale.reshape(()).")


def init_scale_overflows(init_scale) -> str:
    return (f"init_scale={init_scale!r} does not fit in float32 (largest {FLOAT32_MAX:.7g}): the scale is a "
            "float32 tensor. The usual start is 2.0**16.")


def check_state_dict(state_dict: dict) -> None:
    """load_state_dict's checks: torch's (an empty dict is refused), then the keys and values of a GradScaler's."""
    if len(state_dict) == 0:
        raise RuntimeError("The source state dict is empty, possibly because it was saved "
                           "from a disabled instance of GradScaler.")
    missing = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"} - set(state_dict)
    if missing:
        raise KeyError(f"not a GradScaler state dict: missing {sorted(missing)}")
    check_growth_interval(state_dict["growth_interval"])
    warn_if_surely_wrong(init_scale=state_dict["scale"], growth_factor=state_dict["growth_factor"],
                         backoff_factor=state_dict["backoff_factor"], growth_interval=state_dict["growth_interval"])


SCALING_STATE = frozenset({"_init_scale", "_scale", "_per_optimizer_states", "_growth_factor", "_backoff_factor",
                           "_growth_interval", "_init_growth_tracker", "_growth_tracker"})   # only when enabled


def missing_attribute(scaler, name: str) -> AttributeError:
    """What reading a missing attribute raises: for a disabled scaler's scale, factors or interval, which it
    does not keep (torch's disabled GradScaler raises an AttributeError there too), with the reason."""
    message = f"'{type(scaler).__name__}' object has no attribute '{name}'"
    if name in SCALING_STATE and not scaler.__dict__.get("_enabled", True):
        message += (": this scaler is disabled (enabled=False, or device='cuda' without CUDA), and a disabled "
                    "scaler keeps no scale, factors or interval (torch.amp.GradScaler raises this AttributeError "
                    "too). Check scaler.is_enabled() first, or build the scaler with enabled=True.")
    return AttributeError(message)


def _reason(name: str, value: float) -> str | None:
    """Why a value torch accepts cannot be meant, or None when it is fine."""
    if name == "init_scale" and not 0 < value < math.inf:
        return ("is not a positive finite number: the loss is multiplied by it (0 or inf turn the gradients "
                "into 0, inf or NaN; a negative scale flips the loss)")
    if name == "init_scale" and value > FLOAT32_MAX:
        return f"overflows float32 (largest {FLOAT32_MAX:.7g}): the first scale() will fail"
    if name == "growth_factor" and not 1 < value < math.inf:
        return "means the scale never grows (it grows by this factor; a product that is not finite is refused)"
    if name == "backoff_factor" and not 0 < value < 1:
        return ("should lie strictly between 0 and 1: after an overflow the scale must shrink to a smaller "
                "positive value")
    if name == "growth_interval" and value < 1:
        return "means the scale never grows (it grows after this many clean steps in a row)"
    return None


def warn_if_surely_wrong(**values) -> None:
    """Values torch accepts but that cannot be meant: say what they do (a UserWarning), and carry on.

        warn_if_surely_wrong(growth_factor=1.0)   # UserWarning: ... means the scale never grows ...

    Only the keywords given are checked (init_scale, growth_factor, backoff_factor, growth_interval);
    values that are not numbers are left to fail where torch fails on them.
    """
    for name, value in values.items():
        try:
            reason = _reason(name, float(value))
        except (TypeError, ValueError):
            continue
        if reason:
            warnings.warn(f"GradScaler: {name}={value!r} {reason}. {_USUAL}", UserWarning, stacklevel=3)
