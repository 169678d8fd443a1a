"""The algorithm registry: estimators and policy losses are found by name, declare what
they need, and a loss's knobs go from the TOML to the loss with nothing in between."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch
from policy_helpers import policy_update
from tiny_config import tiny_config_text

import asyncflow
from asyncflow.algorithms import registry
from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.algorithms.registry import LossConfig
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch

pytestmark = pytest.mark.timeout(120)


def test_every_entry_resolves_and_every_loss_struct_is_tagged_with_its_name():
    for name, est in registry.ESTIMATORS.items():
        assert est.name == name and callable(registry.resolve(est.compute))
    members = set(getattr(LossConfig, "__args__", (LossConfig,)))
    for name, loss in registry.POLICY_LOSSES.items():
        assert loss.name == name and callable(registry.resolve(loss.build))
        assert registry.loss_name(loss.config()) == name and loss.config in members
    assert registry.ESTIMATORS["ppo"].needs_critic and not registry.ESTIMATORS["grpo"].needs_critic
    with pytest.raises(KeyError, match="known: grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, ppo"):
        registry.estimator("reinforce")


def _batch_and_output(seed: int = 0) -> tuple[ForwardOutput, TokenBatch, LossContext]:
    """Rows whose policy moved far from the rollout's (ratios well outside 1 +- 0.28),
    responses of different lengths, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 10
    mask_BT = torch.zeros(B, T)
    for b, length in enumerate([9, 3, 6, 2, 8, 5]):
        mask_BT[b, 10 - length :] = 1.0
    mu_BT = -2.0 + 0.1 * torch.randn(B, T, generator=g)
    logp_BT = (mu_BT + 1.5 * torch.randn(B, T, generator=g)).requires_grad_()
    adv_BT = torch.tensor([1.0, -1.0, 0.5, -2.0, 1.5, -0.5]).unsqueeze(1) * mask_BT
    tb = TokenBatch(
        input_ids=torch.ones(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T, dtype=torch.long),
        response_mask=mask_BT,
        advantages=adv_BT,
        rollout_logp=mu_BT * mask_BT,
    )
    ctx = LossContext(num_tokens=float(mask_BT.sum()), num_seqs=float(B), dp_size=1)
    return ForwardOutput(logp=logp_BT), tb, ctx


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"])
def test_clip_high_dual_clip_and_every_aggregation_go_from_the_toml_to_the_trainers_loss(tiny_model_dir, agg):
    knobs = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0, "agg": agg}
    policy = policy_update(tiny_model_dir, {"algorithm.loss": {"name": "ppo_clip", **knobs}})
    out, tb, ctx = _batch_and_output()
    got, _ = policy.loss_fn(out, tb, ctx)
    ref_cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg=agg, clip_against="behaviour")
    want, _ = policy_loss_fn(ref_cfg)(out, tb, ctx)
    assert torch.equal(got, want)
    # and each knob changes the loss: the defaults (0.2, 0.2, no dual clip, token-mean) give another
    default, _ = policy_update(tiny_model_dir, {}).loss_fn(out, tb, ctx)
    assert not torch.equal(got, default)
    for key, plain in (("clip_high", 0.2), ("dual_clip", None)):
        other, _ = policy_loss_fn(msgspec.structs.replace(ref_cfg, **{key: plain}))(out, tb, ctx)
        assert not torch.equal(other, want), key


def test_an_estimator_that_needs_a_critic_gets_one_and_the_group_estimator_none(tiny_model_dir):
    assert policy_update(tiny_model_dir, {"algorithm": {"name": "ppo"}}).critic is not None
    assert policy_update(tiny_model_dir, {"algorithm": {"name": "grpo"}}).critic is None


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"algorithm": {"name": "reinforce"}},
            r"algorithm.name = 'reinforce': not an advantage estimator.*'grpo', 'rloo'.*'ppo'",
        ),
        ({"algorithm.loss": {"name": "cisp"}}, r"algorithm.loss.name"),
        ({"algorithm.loss": {"dual_clip": 0.5}}, r"algorithm.loss.dual_clip = 0.5: use 0 \(off\) or a bound above 1"),
        ({"algorithm.loss": {"tis_cap": 2.0}}, r"algorithm.loss.tis_cap: unknown key"),
        ({"algorithm": {"clip_eps": 0.2}}, r"algorithm.clip_eps: moved to .*\[algorithm.loss\] clip_low and clip_high"),
        ({"algorithm": {"loss_agg": "seq_mean"}}, r"algorithm.loss_agg: moved to .*\[algorithm.loss\] agg"),
    ],
)
def test_a_wrong_or_moved_algorithm_key_names_the_key_and_the_fix(changes, message):
    with pytest.raises(ConfigError, match=message):
        load_config_text(tiny_config_text(changes))


def _name_tests(path: Path) -> list[int]:
    """Lines of ``x.name == "grpo"`` (or != / in) against an estimator's or loss's name."""
    names = set(registry.ESTIMATORS) | set(registry.POLICY_LOSSES)
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "name" for s in sides) and any(
                isinstance(s, ast.Constant) and s.value in names for s in sides
            ):
                lines.append(node.lineno)
    return lines


ALLOWED_NAME_TESTS = {"bench/peer.py": "TRL's GRPOTrainer runs GRPO only: the comparison says which runs it can mirror"}


def test_no_module_outside_the_registry_tests_an_algorithms_name():
    package = Path(asyncflow.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        if rel.startswith("algorithms/") or rel in ALLOWED_NAME_TESTS:
            continue
        found += [f"{rel}:{line}" for line in _name_tests(path)]
    assert not found, "ask the registry what the algorithm needs (algorithm.needs_critic, ...): " + ", ".join(found)
    assert all(_name_tests(package / rel) for rel in ALLOWED_NAME_TESTS)  # an entry no longer needed goes


def test_reading_a_config_imports_no_torch():
    code = (
        "import sys, msgspec, asyncflow.config.run as r; "
        "c = msgspec.convert({'algorithm': {'loss': {'name': 'ppo_clip', 'clip_high': 0.28}}}, r.RunConfig); "
        "assert c.algorithm.loss.clip_high == 0.28 and not c.algorithm.needs_critic; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr
