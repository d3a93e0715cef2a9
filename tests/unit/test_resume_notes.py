"""Strategies whose checkpoint lacks state of each rank's say their resume is not exact (run.json
resume_inexact and a warning), and the others say nothing: ddp_powersgd resumed at step 16 of 30
ended on 3.663 where the uninterrupted run ended on 3.520, without a word (found by review)."""
from scalelab.strategies.ddp import DDP
from scalelab.strategies.single import Single


def test_which_resumes_are_not_exact():
    assert DDP().resume_note(2) is None and DDP(comm_hook="bf16").resume_note(2) is None
    assert DDP(comm_hook="powersgd").resume_note(2).startswith("PowerSGD: each rank's error feedback")
    assert DDP(local_sgd_period=4).resume_note(2).startswith("local SGD: every rank resumes rank 0's replica")
    assert Single().resume_note(1) is None                     # one device: the checkpoint is the run's
    assert Single().resume_note(2).startswith("single on several ranks: every replica resumes rank 0's")
