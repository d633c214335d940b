"""The exercises and their grading: the learner's side of a check, the grader's side, and the grader.

    from ampteach.grading.checks import check_round_to_bf16      # in a notebook: the learner's side
    $ ampteach grade exercises/NAME.ipynb                          # the grader

Two sides, which never meet in one process:
    checks/     what runs in the learner's kernel (and in the grading sandbox): the check functions a
                notebook calls, the helpers it uses, the refusals that watch the learner's code, the
                plans that drive it, and the driver that answers a judge. It imports no judge.
    judges/     what only the grader runs: the reference answers, the hidden cases (drawn when they run)
                and the comparisons that decide every verdict.
The grader: exercises (generates exercises/ and the grader's copy of the checks from solutions/),
autograde (one notebook: its cells in a sandbox, its checks judged here), sandbox and session (the
notebook's process), grade (one notebook or a class, the gradebook), the nbgrader and Otter exports.
Imports ampteach.lab, ampteach.training and ampteach.amp.
"""
