"""asyncflow's GRPO gradient on a batch equals TRL's on the same batch.

``afctl bench peer`` compares asyncflow with TRL's ``GRPOTrainer`` at the settings it
maps (``bench/_peer_trl.py``: loss ``dapo`` = ``token-mean``, ``scale_rewards="group"``
= ``std_normalize``, no KL, one optimizer step a batch). Where the two learn at
different rates per step, this says whether the update itself differs: the trainer's
whole path (``PolicyUpdate.train``: the queue's columns, the advantages, the loss over
micro-batches, a step streamed in parts) against TRL's own ``_compute_loss`` and its
advantage formula, on the same on-policy batch of a tiny model, in float32. The batch
is built by hand (no generation), so the two see the same tokens: equal-length prompts
(TRL left-pads prompts, which moves their position ids), responses of mixed lengths,
some ending in the stop token, every group with rewards that differ.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from policy_helpers import columns, policy_update  # noqa: E402

GROUP, GROUPS, PROMPT_LEN = 4, 3, 6
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.25]  # each group's rewards differ


def _batch(eos: int) -> tuple[list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for g in range(GROUPS):
        prompt = torch.randint(5, 60, (PROMPT_LEN,), generator=gen).tolist()
        for i in range(GROUP):
            length = 3 + (g + 2 * i) % 5
            body = torch.randint(5, 60, (length,), generator=gen).tolist()
            prompts.append(prompt)
            responses.append(body[:-1] + [eos] if i % 2 else body)  # odd samples stopped, even ones cut at the limit
    return prompts, responses


def _logp(model, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
    """Each response token's log-prob under ``model`` (float32): the rollout's, on-policy."""
    out = []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            logits = model(torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) + len(r) - 1].float()
            out.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None])[:, 0].tolist())
    return out


def _trl_grads(model_dir, prompts, responses, tmp_path) -> dict[str, torch.Tensor]:
    """TRL's gradient: ``GRPOTrainer._compute_loss`` on the batch, advantages by its formula."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=GROUP * GROUPS,
        num_generations=GROUP,
        max_completion_length=8,
        loss_type="dapo",
        scale_rewards="group",
        beta=0.0,
        num_iterations=1,
        use_cpu=True,
        bf16=False,
        report_to=[],
        gradient_checkpointing=False,
    )
    data = Dataset.from_dict({"prompt": ["x"] * (GROUP * GROUPS)})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets before a step
    width = max(len(r) for r in responses)
    completion_ids = torch.tensor([r + [tokenizer.pad_token_id or 0] * (width - len(r)) for r in responses])
    completion_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in responses])
    # GRPOTrainer._generate_and_score_completions, scale_rewards="group": (r - group mean) / (group std + 1e-4)
    rewards = torch.tensor(REWARDS)
    grouped = rewards.view(-1, GROUP)
    mean = grouped.mean(dim=1).repeat_interleave(GROUP)
    std = nanstd(grouped, dim=1).repeat_interleave(GROUP)
    advantages = (rewards - mean) / (std + 1e-4)
    inputs = {
        "prompt_ids": torch.tensor(prompts),
        "prompt_mask": torch.ones(len(prompts), PROMPT_LEN, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "old_per_token_logps": None,
        "num_items_in_batch": completion_mask.sum(),
    }
    model.train()
    trainer._compute_loss(model, inputs).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _asyncflow_grads(model_dir, prompts, responses, changes, streamed: bool) -> dict[str, torch.Tensor]:
    """asyncflow's gradient: the trainer's step (``PolicyUpdate``) on the rows as the queue holds them,
    read where the optimizer would take it (after the step's rescaling, before clipping)."""
    pu = policy_update(model_dir, changes)
    grads: dict[str, torch.Tensor] = {}
    apply = pu.engine.apply_gradients

    def capture(grad_scale: float = 1.0):
        for name, p in pu.engine.net.named_parameters():
            if p.grad is not None:
                grads[name.removeprefix("lm.")] = p.grad.detach().clone() * grad_scale
        return apply(grad_scale)

    pu.engine.apply_gradients = capture  # type: ignore[method-assign]
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = reference.config.eos_token_id
    cols = columns(prompts, responses, REWARDS, _logp(reference, prompts, responses), truncated=[r[-1] != eos for r in responses])
    groups = [b // GROUP for b in range(len(prompts))]
    if not streamed:
        pu.train(cols, groups, versions=[0] * len(prompts), step=0)
    else:  # a step in parts of one prompt group each (workflow.stream_step)
        pu.begin_parts(len(prompts))
        for g in range(GROUPS):
            rows = slice(g * GROUP, (g + 1) * GROUP)
            pu.train_part({k: v[rows] for k, v in cols.items()}, groups[rows], [0] * GROUP, step=0)
        pu.finish_parts()
    assert grads, "the trainer took no optimizer step"
    return grads


def _compare(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Cosine and norm ratio (ours / theirs) of the whole gradient, over the parameters both have."""
    names = sorted(set(ours) & set(theirs))
    assert len(names) >= len(theirs) - 1, f"parameters missing on our side: {sorted(set(theirs) - set(ours))}"
    a = torch.cat([ours[n].flatten() for n in names])
    b = torch.cat([theirs[n].flatten() for n in names])
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0)), float(a.norm() / b.norm())


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "clip_against,micro_batch_size,share_prompts,streamed",
    [
        ("proximal", 12, False, False),  # the whole batch in one micro-batch
        ("behaviour", 5, False, False),  # micro-batches across group boundaries, the example's clip
        ("proximal", 4, True, False),  # bench peer's decoupled set: a prompt once per micro-batch
        ("proximal", 4, True, True),  # ... streamed in parts of one group (real_paired_stream)
    ],
)
def test_grpo_gradient_equals_trls(tiny_model_dir, tmp_path, clip_against, micro_batch_size, share_prompts, streamed):
    from transformers import AutoConfig

    eos = AutoConfig.from_pretrained(tiny_model_dir).eos_token_id
    prompts, responses = _batch(eos)
    theirs = _trl_grads(tiny_model_dir, prompts, responses, tmp_path)
    changes = {
        "algorithm": {"group_size": GROUP, "clip_against": clip_against, "kl_coef": 0.0, "std_normalize": True},
        "algorithm.loss": {"agg": "token-mean"},
        "train.engine": {"micro_batch_size": micro_batch_size, "share_prompts": share_prompts, "autocast": "off"},
        "rollout.sampling": {"max_new_tokens": 8, "temperature": 1.0},
    }
    if streamed:
        changes["workflow"] = {"mode": "async", "staleness": 0, "stream_step": True}
    ours = _asyncflow_grads(tiny_model_dir, prompts, responses, changes, streamed)
    cosine, ratio = _compare(ours, theirs)
    assert cosine > 0.9999, f"the update's direction differs from TRL's: cosine {cosine:.6f}"
    assert abs(ratio - 1) < 1e-3, f"the update's size differs from TRL's: norm ratio {ratio:.6f}"
