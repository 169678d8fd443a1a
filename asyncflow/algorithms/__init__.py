"""RL algorithms: ``registry`` (the advantage estimators and policy losses a config
names, torch-free, with ``loss_configs``, the losses' ``[algorithm.loss]`` Structs),
``estimators`` (the estimators' functions), and pure functions on tensors: ``advantages`` (GRPO, GAE), ``kl``
(k1/k2/k3), ``losses`` (clipped policy and value losses, aggregation),
``off_policy`` (importance weights and masks between the rollout and the trainer's
policy, mismatch figures), ``grpo`` / ``ppo`` (loss assembly for a training engine),
``rewards`` (rule-based and custom by dotted path). The tiny tasks live in
``asyncflow.toy``. Nothing is imported at package level.
"""
