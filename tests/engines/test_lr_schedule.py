"""The learning-rate schedule: warmup then constant or cosine, continued across a resume."""

from __future__ import annotations

import math

import pytest
from test_torch_train import batch, nll

from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.engines.lr_schedule import lr_at


@pytest.mark.timeout(10)
def test_warmup_rises_linearly_then_cosine_reaches_the_minimum_at_the_last_step():
    cfg = TrainEngineConfig(lr=1.0, lr_warmup_steps=4, lr_schedule="cosine", lr_min_ratio=0.1)
    total = 14  # steps 0..3 warm up, 4..13 decay (13 is the last)
    assert [lr_at(cfg, k, total) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(cfg, 4, total) == pytest.approx(1.0)
    halfway = 4 + (13 - 4) / 2
    assert lr_at(cfg, int(halfway), total) > lr_at(cfg, int(halfway) + 1, total)
    assert lr_at(cfg, 13, total) == pytest.approx(0.1)
    assert lr_at(cfg, 20, total) == pytest.approx(0.1)  # past the end: stays at the minimum
    mid = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (8 - 4) / 9))
    assert lr_at(cfg, 8, total) == pytest.approx(mid)


@pytest.mark.timeout(10)
def test_constant_schedule_keeps_the_lr_after_warmup_and_cosine_without_a_length_says_what_to_pass():
    cfg = TrainEngineConfig(lr=2e-3, lr_warmup_steps=2)
    assert [lr_at(cfg, k, 0) for k in range(4)] == [1e-3, 2e-3, 2e-3, 2e-3]
    with pytest.raises(ValueError, match="total_steps"):
        lr_at(TrainEngineConfig(lr_schedule="cosine"), 0, 0)


@pytest.mark.timeout(60)
def test_the_engine_reports_each_steps_lr_and_a_resumed_engine_continues_the_schedule(qwen2_dir, tmp_path):
    cfg = TrainEngineConfig(lr=1e-3, lr_warmup_steps=3, lr_schedule="cosine", lr_min_ratio=0.0, micro_batch_size=4)
    total = 6
    first = build_train_engine(cfg, qwen2_dir, total_steps=total)
    seen = [first.train_step(batch(), nll).metrics["lr"] for _ in range(4)]
    assert seen == pytest.approx([lr_at(cfg, k, total) for k in range(4)])
    assert first.optimizer.param_groups[0]["lr"] == pytest.approx(seen[-1])
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = build_train_engine(cfg, qwen2_dir, total_steps=total)
    resumed.load_checkpoint(tmp_path / "ckpt")
    after = [resumed.train_step(batch(), nll).metrics["lr"] for _ in range(2)]
    # steps 4 and 5: on down the cosine, not back to the first warmup step
    assert after == pytest.approx([lr_at(cfg, 4, total), lr_at(cfg, 5, total)])
    assert after[-1] == pytest.approx(0.0) and after[0] < seen[-1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_the_hugging_face_convention_gives_the_lr_of_transformers_schedulers_at_every_step(schedule):
    """``lr_schedule_convention = "huggingface"``: warmup from 0 (step 0 does not move the weights)
    and a cosine that reaches its minimum one step after the last, as transformers' schedulers
    (and so TRL's GRPOTrainer) give it."""
    import torch
    from transformers import get_scheduler

    total, warmup, lr = 10, 3, 2e-5
    cfg = TrainEngineConfig(
        lr=lr, lr_warmup_steps=warmup, lr_schedule=schedule, lr_min_ratio=0.1, lr_schedule_convention="huggingface"
    )
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    name, kwargs = {"constant": ("constant_with_warmup", {}), "cosine": ("cosine_with_min_lr", {"min_lr_rate": 0.1})}[schedule]
    sched = get_scheduler(name, opt, num_warmup_steps=warmup, num_training_steps=total, scheduler_specific_kwargs=kwargs)
    theirs = []
    for _ in range(total):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert [lr_at(cfg, k, total) for k in range(total)] == pytest.approx(theirs, rel=1e-9, abs=1e-15)
    assert lr_at(cfg, 0, total) == 0.0
