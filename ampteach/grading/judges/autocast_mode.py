"""Judge of build it yourself 6: the learner's autocast mode, op by op against torch.autocast.

    def _training_step(learner: Learner, cls: Ref) -> None:
    import torch

    from ampteach.lab.compare_torch import torch_autocast

    got, got_grads = learner.plan("autocast_mode.training_step", {"cls": cls})
    want, want_grads = training_step(lambda: torch_autocast("cpu", torch.bfloat16))
    if not same_bits(got, want) or len(got_grads) != len(want_grads) or \
            not all(g is not None and same_bits(g, w) for g, w in zip(got_grads, want_grads)):
        raise CheckFailed(f"a training step of a small MLP: loss {got.item()!r} ({short(got.dtype)}) and gradients "
                          f"should equal torch.autocast's ({want.item()!r}, {short(want.dtype)}) bit for bit: "
                          f"are your casts ordinary differentiable .to() calls?")


@judge("check_autocast_mode")
def check_autocast_mode(learner: Learner, cls: Ref) -> str:
    compared = run_cases(learner, cls, VISIBLE)
    _training_step(learner, cls)
    return (f"{compared} op cases ({len(VISIBLE)} ops in up to 4 regions, out= and in place among them) and an MLP "
            f"training step agree with torch.autocast: dtypes everywhere, values bit for bit on CPU")


@judge("check_autocast_mode_hidden")
def check_autocast_mode_hidden(learner: Learner, cls: Ref) -> str:
    compared = run_cases(learner, cls, HIDDEN)
    return f"{compared} more op cases agree with torch.autocast"
