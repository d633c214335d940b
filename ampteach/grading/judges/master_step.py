"""Judge of build it yourself 3: the learner's O2 step against ampteach.MasterWeights + torch.amp.GradScaler.

    @judge("check_master_step")    # SGD with momentum and AdamW, five steps each, an overflow at step 2

The learner's process runs the plan (ampteach.grading.checks.master_step.run_steps); this replays the
same model, batches and overflow with MasterWeights and compares every step bit for bit.
"""

from __future__ import annotations

import torch

from ampteach.grading.checks.common import CheckFailed
from ampteach.grading.checks.master_step import BECAUSE, OPTIMIZERS, OVERFLOW_AT, STEPS, o2_steps
from ampteach.grading.judges import judge
from ampteach.grading.judges.learner import Learner, Ref
from ampteach.grading.judges.scan import refuse_uses

LIBRARY = {"MasterWeights", "grads_to_master", "master_to_model"}


def reference_steps(opt_name: str, data_seed: int) -> list[dict]:
    """The same steps with the course's MasterWeights and torch.amp.GradScaler."""
    from ampteach.amp.master import MasterWeights

    held: list[MasterWeights] = []

    def make_copies(model):
        held.append(MasterWeights(model))
        return list(held[0].pairs)

    def step(pairs, opt, scaler) -> None:
        held[0].grads_to_master()
        scaler.step(opt)
        scaler.update()
        held[0].master_to_model()

    return o2_steps(make_copies, step, opt_name, data_seed, watched=False)


@judge("check_master_step")
def check_master_step(learner: Learner, make_master_copies: Ref, master_step: Ref) -> str:
    refuse_uses(learner, LIBRARY.__contains__, BECAUSE)
    for opt_name in OPTIMIZERS:
        seed = learner.seed(1)
        got = learner.plan("master_step.steps", {"make_master_copies": make_master_copies,
                                                 "master_step": master_step}, opt_name, seed)
        want = reference_steps(opt_name, seed)
        for step, (mine, ref) in enumerate(zip(got["steps"], want)):
            case = f"{opt_name}, step {step}" + (" (an inf gradient: the step must be skipped)"
                                                 if step == OVERFLOW_AT else "")
            if mine["scale"] != ref["scale"]:
                raise CheckFailed(f"{case}: expected loss scale {ref['scale']}, got {mine['scale']} "
                                  f"(scaler.step then scaler.update, once per step)")
            for i, (m, n) in enumerate(zip(mine["masters"], ref["masters"])):
                if not (isinstance(m, torch.Tensor) and m.shape == n.shape and torch.equal(m, n)):
                    diff = (m - n).abs().max().item() if isinstance(m, torch.Tensor) and m.shape == n.shape else "?"
                    raise CheckFailed(f"{case}: fp32 copy {i} differs from the reference (max |difference| "
                                      f"{diff:.3g}): its .grad must be the model's grad in fp32"
                                      if diff != "?" else f"{case}: fp32 copy {i} is not a tensor of the "
                                      f"parameter's shape")
            for i, (p, q) in enumerate(zip(mine["params"], ref["params"])):
                if not torch.equal(p, q):
                    raise CheckFailed(f"{case}: model parameter {i} differs from the reference: after the step, "
                                      f"copy the fp32 values back into the half model")
        if len(got["steps"]) != STEPS:
            raise CheckFailed(f"{opt_name}: expected {STEPS} steps, the run stopped after {len(got['steps'])}")
    return "SGD and AdamW, 5 steps each with an overflow: same fp32 copies, half weights and scale"
