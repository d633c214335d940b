"""The exercises and their grading: checks, the generator of exercises/ from solutions/, the grader.

    from ampteach.grading.checks import check_round_to_bf16
    $ ampteach grade exercises/NAME.ipynb

checks (one module per exercise), exercises (generates exercises/ and the grader's copy of the checks),
autograde (one notebook, the course's checks restored, run by nbval), grade (one notebook or a class).
Imports ampteach.lab, ampteach.training and ampteach.amp.
"""
