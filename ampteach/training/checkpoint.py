"""Checkpoints that resume a mixed-precision run exactly: fp32 weights, optimizer, loss scaler, step.

    save_checkpoint("run.pt", model, opt, scaler, master=master, step=step, history=history)
    ...                                            # killed; a new process builds the same objects
    ckpt = load_checkpoint("run.pt", model, opt, scaler, master=master)   # restores them in place
    ckpt.step, ckpt.history                        # where to go on from, and what was measured so far

    train(model, data, config, checkpoint_path="run.pt", checkpoint_every=50)   # train() does both
    train(model, data, config, resume_from="run.pt")

An AMP run has state beyond the model and the optimizer, and a resumed run only follows the original
one if all of it comes back (the textbook's pitfall 5):
- the loss scaler's state_dict(): the scale S and the count of clean steps towards its next growth.
  Without it a resumed fp16 run restarts at init_scale and takes a different path.
- with master weights (O2), the fp32 master values, not the half model: a half copy has already
  rounded away the low bits the master keeps, w_half = round(w_fp32).
- the step counter, the random number generators and the History so far.
The file holds only tensors, plain containers, strings, booleans and numbers, so it is read with
torch.load(weights_only=True): loading a checkpoint cannot run code (a full pickle can), and a file
that needs more is refused instead of executed. It is written to a temporary file and renamed, so
a run killed while saving leaves the previous checkpoint whole.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from ampteach.amp.master import HALF_DTYPES, MasterWeights
from ampteach.training.config import History

FORMAT = "ampteach-checkpoint"
VERSION = 1


class Checkpoint(NamedTuple):
    """What load_checkpoint read besides the state it restored in place."""

    step: int                  # optimizer steps done (the step a resumed run starts with)
    history: Any               # the run's train.History so far, or None if none was saved
    extra: dict                # whatever the caller saved with extra=


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler=None, *, master: MasterWeights | None = None, step: int = 0, history=None,
                    extra: dict | None = None) -> Path:
    """Write everything needed to resume training to path (atomically) and return the path.

    model: its state_dict, or with master (O2) master.state_dict(), in which every weight is fp32.
    scaler: torch.amp.GradScaler or ampteach.GradScaler (same state_dict); None or a scaler without
    state (StaticLossScaler, a disabled one) saves none. history: a train.History. extra: a dict of
    tensors, numbers, strings and plain containers (anything torch.load(weights_only=True) reads).
    """
    if master is not None and master.model is not model:
        raise ValueError("master was built from a different model: pass the model MasterWeights(model) was built from")
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": master.state_dict() if master is not None else model.state_dict(),
        "master": master is not None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if hasattr(scaler, "state_dict") else None,
        "step": int(step),
        "history": history.to_dict() if history is not None else None,
        "rng": _rng_state(),
        "extra": dict(extra or {}),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler=None, *, master: MasterWeights | None = None, restore_rng: bool = True,
                    map_location: str | torch.device | None = None) -> Checkpoint:
    """Restore model (or master and model), optimizer, scaler and the RNGs from path, in place.

    Build the objects exactly as for a fresh run first (the same model, prepare()/to_half and
    MasterWeights for O2, the same optimizer and scaler), then load. The file is read with
    torch.load(weights_only=True). An fp32 checkpoint written with master loads into a half model
    with its master copies or into a plain fp32 model (e.g. for evaluation); a half checkpoint into
    master is refused, since its low bits are gone.
    """
    state = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{Path(path).name} is not a checkpoint written by ampteach.save_checkpoint "
                         f"(no 'format': {FORMAT!r} entry); for a bare state_dict use "
                         f"model.load_state_dict(torch.load(...))")
    if master is not None:
        master.load_state_dict(state["model"])      # exact fp32 masters, model = round(masters)
    else:
        _refuse_to_upcast_half(state["model"], model)
        model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise ValueError("this checkpoint was saved without an optimizer; pass optimizer=None, "
                             "or save with save_checkpoint(path, model, optimizer, ...)")
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    elif _has_scaler_state(scaler) and state["scaler"] is None:
        raise ValueError("this checkpoint holds no loss-scaler state but you passed an enabled GradScaler: "
                         "it would restart at init_scale and the run would not resume exactly. Save the "
                         "scaler with the checkpoint, or pass scaler=None to start it afresh on purpose")
    if restore_rng:
        _set_rng_state(state["rng"])
    history = History.from_dict(state["history"]) if state["history"] is not None else None
    return Checkpoint(state["step"], history, state["extra"])


def _has_scaler_state(scaler) -> bool:
    return hasattr(scaler, "state_dict") and bool(scaler.state_dict())


def _refuse_to_upcast_half(saved: dict, model: nn.Module) -> None:
    """A half checkpoint loaded into an fp32 weight would look fine and silently miss the master's low bits."""
    params = dict(model.named_parameters())
    for name, t in saved.items():
        p = params.get(name)
        if p is not None and t.dtype in HALF_DTYPES and p.dtype == torch.float32:
            raise ValueError(f"{name!r} in this checkpoint is {t.dtype} but the model's is float32: the checkpoint "
                             f"was saved from a half model and has lost its master weights' low bits. Save with "
                             f"save_checkpoint(..., master=master) in the run that used MasterWeights")


def _rng_state() -> dict:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["cpu"].cpu())
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
