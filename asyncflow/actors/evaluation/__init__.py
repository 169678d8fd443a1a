"""Held-out evaluation (``[eval]``), one module per part:

- ``evaluator.py``: ``Evaluator``, a private rollout engine generating for the held-out
  prompts and scoring them (single-turn, or episodes through the environment), and the
  records it keeps: eval.jsonl, eval_samples.jsonl, ``checkpoints/best``;
- ``actor.py``: ``EvaluatorActor`` and its ``ROLE``, the ``evaluator`` process that runs
  the evaluations the trainer asks for while it goes on training (``eval.where``).

The trainer evaluates in its own process with the same ``Evaluator`` when the evaluations
do not run in the evaluator's (``RunConfig.eval_in_process``).
"""
