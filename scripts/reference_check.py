"""Our losses, aggregations, advantage estimators and KL controller against the reference
implementations' own functions, on identical random inputs (float64): the largest
absolute difference of the loss (or advantages, or coefficient) and of its gradient
with respect to the policy's log-probs.

    PYTHONPATH=. python scripts/reference_check.py              # the table, as text
    PYTHONPATH=. python scripts/reference_check.py --markdown   # as markdown
    PYTHONPATH=. python scripts/reference_check.py --write-docs # into docs/algorithms.md

References, each used only where it imports here (a row says "skipped" and why otherwise):
- verl 0.9.1 (``pip install --no-deps verl==0.9.1``, then omegaconf, tensordict, codetiming):
  ``verl.trainer.ppo.core_algos``. Its package ``__init__`` imports ray, which the
  functions compared do not use: when ray is not installed a module standing in for it
  is put in ``sys.modules`` first, and the table says so.
- TRL (installed): ``GRPOTrainer._compute_loss`` of each loss type, called on a stand-in
  trainer that returns our log-probs as the model's.
- AReaL: not a pip package here; its functions are read from a checkout or a git mirror
  (``--areal DIR``, default ``$AREAL_SRC`` or /work/.mirror/inclusionAI+AReaL/repo) and
  executed as they are (``areal/utils/functional/functional.py`` whole, with stand-ins
  for its two areal imports; from ``areal/trainer/ppo/actor.py`` the functions
  ``compute_prox_logp_approximations``, ``_apply_m2po_masking``, ``_get_m2po_loss_mask``).

Our side is always built through the registry, by name, from an ``[algorithm]`` TOML.
Nothing of the references is copied into asyncflow.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import subprocess
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from asyncflow.algorithms import registry
from asyncflow.algorithms.dynamic_sampling import choose_groups
from asyncflow.algorithms.estimators import AdvantageInputs
from asyncflow.algorithms.kl_control import controller
from asyncflow.config.load import load_config_text
from asyncflow.engines.base import ForwardOutput, LossContext, TokenBatch

TOL = 1e-5
B, T, N = 16, 24, 4  # rows, tokens, responses per prompt
DOCS = Path(__file__).resolve().parent.parent / "docs" / "algorithms.md"
BEGIN, END = "<!-- reference-check:begin -->", "<!-- reference-check:end -->"


@dataclass
class Row:
    quantity: str
    ours: str
    reference: str
    value_diff: float | None = None
    grad_diff: float | None = None
    note: str = ""

    @property
    def status(self) -> str:
        if self.value_diff is None:
            return "skipped"
        worst = max(self.value_diff, self.grad_diff or 0.0)
        return "agrees" if worst <= TOL else "DIFFERS"


NOTES: list[str] = []


# -- the inputs ------------------------------------------------------------------------------------
def inputs(seed: int = 0, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    mu = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * mask
    logp = (mu + spread * torch.randn(B, T, generator=g, dtype=torch.float64)) * mask
    adv_B = torch.randn(B, generator=g, dtype=torch.float64)
    return logp, mu, adv_B[:, None] * mask, mask


def leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


def ours_loss(toml: str, logp, mu, adv, mask, horizon: int = T, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    """Our loss through the registry (by name from the TOML) and its gradient w.r.t. logp."""
    alg = load_config_text(toml).algorithm
    build = registry.resolve(registry.policy_loss(registry.loss_name(alg.loss)).build)
    x = leaf(logp)
    tb = TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=mask,
        rollout_logp=mu,
        advantages=adv,
        extra=dict(extra),
    )
    ctx = LossContext(num_tokens=float(mask.sum()), num_seqs=float((mask.sum(1) > 0).sum()))
    loss, _ = build(alg, None, horizon=horizon)(ForwardOutput(logp=x), tb, ctx)
    (g,) = torch.autograd.grad(loss, x)
    return loss, g


def reference_loss(fn: Callable[[torch.Tensor], torch.Tensor], logp) -> tuple[torch.Tensor, torch.Tensor]:
    x = leaf(logp)
    loss = fn(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss, g


def compare_loss(rows, quantity, ours_toml, ref_name, ref_fn, data, note="", scale: float = 1.0, **kw) -> None:
    logp, mu, adv, mask = data
    ours, g_ours = ours_loss(ours_toml, logp, mu, adv, mask, **kw)
    ref, g_ref = reference_loss(ref_fn, logp)
    rows.append(Row(quantity, ours_toml_name(ours_toml), ref_name, diff(ours * scale, ref), diff(g_ours * scale, g_ref), note))


def ours_toml_name(toml: str) -> str:
    """The TOML's settings as one line: ``name = "cispo", clip_low = 1.0``."""
    return ", ".join(line.strip() for line in toml.splitlines() if line.strip() and not line.startswith("["))


def estimate(toml: str, rewards_B, mask, groups, ref=None):
    alg = load_config_text(f"[algorithm]\ngroup_size = {N}\n{toml}").algorithm
    tb = TokenBatch(
        input_ids=torch.zeros(B, T, dtype=torch.long),
        attention_mask=torch.ones(B, T),
        response_mask=mask,
        rollout_logp=-torch.ones(B, T, dtype=torch.float64) * mask,
        ref_logp=ref,
    )
    return registry.resolve(alg.estimator.compute)(AdvantageInputs(tb, rewards_B, groups, alg)).advantages_BT


def last_token(rewards_B, mask):
    out = torch.zeros_like(mask)
    last = mask.sum(1).long() - 1
    out[torch.arange(B), last] = rewards_B
    return out


# -- verl ------------------------------------------------------------------------------------------
def import_verl():
    """``verl.trainer.ppo.core_algos``, with a stand-in for ray when it is not installed."""
    stubbed = []
    for name in ("ray",):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            module = types.ModuleType(name)

            def missing(attr: str, _name: str = name):
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return type(attr, (), {})

            module.__getattr__ = missing  # type: ignore[method-assign]
            sys.modules[name] = module
            stubbed.append(name)
    core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    version = importlib.metadata.version("verl")
    if stubbed:
        NOTES.append(f"verl {version}: {', '.join(stubbed)} not installed; a stand-in module was imported in its place.")
    return core_algos, ActorConfig, version


def verl_rows(rows: list[Row]) -> None:
    try:
        ca, ActorConfig, version = import_verl()
    except Exception as exc:  # the reference is optional: say why it is skipped
        rows.append(Row("verl's core_algos", "", "verl", note=f"skipped: {type(exc).__name__}: {exc}"))
        return
    ref = f"verl {version} core_algos"
    data = inputs(0)
    logp, mu, adv, mask = data

    def actor(low, high, c=3.0):
        return ActorConfig(
            strategy="fsdp",
            clip_ratio=low,
            clip_ratio_low=low,
            clip_ratio_high=high,
            clip_ratio_c=c,
            ppo_micro_batch_size_per_gpu=1,
            ppo_mini_batch_size=B,
            rollout_n=1,
        )

    def vanilla(agg, low=0.2, high=0.28, c=3.0):
        return lambda x: ca.compute_policy_loss_vanilla(mu, x, adv, mask, agg, actor(low, high, c))[0]

    dual = "[algorithm.loss]\nname = 'ppo_clip'\nclip_low = 0.2\nclip_high = 0.28\ndual_clip = 3.0\n"
    for agg in ("token-mean", "token-sum", "seq-mean-token-sum-norm"):
        compare_loss(
            rows,
            f"PPO clip, clip-higher and dual clip, agg {agg}",
            dual + f"agg = '{agg}'\n",
            f"{ref}.compute_policy_loss_vanilla ({agg})",
            vanilla(agg),
            data,
            note="verl's -norm divisor: the padded width, here T = max_new_tokens" if agg.endswith("norm") else "",
        )
    for low, high in ((0.2, 0.28), (1.0, 4.0)):
        compare_loss(
            rows,
            f"CISPO, clip {low} / {high}",
            f"[algorithm.loss]\nname = 'cispo'\nclip_low = {low}\nclip_high = {high}\n",
            f"{ref}.compute_policy_loss_cispo",
            lambda x, low=low, high=high: ca.compute_policy_loss_cispo(mu, x, adv, mask, "token-mean", actor(low, high))[0],
            data,
        )
    compare_loss(
        rows,
        "GSPO",
        "[algorithm.loss]\nname = 'gspo'\n",
        f"{ref}.compute_policy_loss_gspo",
        lambda x: ca.compute_policy_loss_gspo(mu, x, adv, mask, "seq-mean-token-mean", actor(3e-4, 4e-4))[0],
        inputs(0, spread=1e-3),
    )
    # advantage estimators: one prompt group per N rows, interleaved
    groups = [b % (B // N) for b in range(B)]
    index = np.array(groups)
    rewards_B = torch.rand(B, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    tlr = last_token(rewards_B, mask)
    cfg = SimpleNamespace(gamma=0.95)
    cases = [
        (
            "Dr. GRPO advantages (no std)",
            "name = 'grpo'\nstd_normalize = false",
            "compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False)",
            lambda: ca.compute_grpo_outcome_advantage(tlr, mask, index, norm_adv_by_std_in_grpo=False)[0],
        ),
        (
            "RLOO advantages",
            "name = 'rloo'",
            "compute_rloo_outcome_advantage",
            lambda: ca.compute_rloo_outcome_advantage(tlr, mask, index)[0],
        ),
        (
            "REINFORCE++ advantages (gamma 0.95)",
            "name = 'reinforce_plus_plus'\ngamma = 0.95",
            "compute_reinforce_plus_plus_outcome_advantage",
            lambda: ca.compute_reinforce_plus_plus_outcome_advantage(tlr, mask, config=cfg)[0],
        ),
        (
            "REINFORCE++-baseline advantages",
            "name = 'reinforce_plus_plus_baseline'",
            "compute_reinforce_plus_plus_baseline_outcome_advantage",
            lambda: ca.compute_reinforce_plus_plus_baseline_outcome_advantage(tlr, mask, index)[0],
        ),
    ]
    for quantity, toml, fn_name, fn in cases:
        ours = estimate(toml, rewards_B, mask, groups)
        rows.append(Row(quantity, ours_toml_name(toml), f"{ref}.{fn_name}", diff(ours, fn())))
    # KL in the reward, REINFORCE++ (per-token k1 penalty on the token rewards, verl's apply_kl_penalty)
    ref_logp = -torch.rand(B, T, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * mask
    kld = ca.kl_penalty(-torch.ones(B, T, dtype=torch.float64) * mask, ref_logp, "kl") * mask
    toml = "name = 'reinforce_plus_plus'\ngamma = 0.95\nkl_coef = 0.05\nkl_in_reward = true\nkl_estimator = 'k1'"
    ours = estimate(toml, rewards_B, mask, groups, ref=ref_logp)
    verl = ca.compute_reinforce_plus_plus_outcome_advantage(tlr - 0.05 * kld, mask, config=cfg)[0]
    rows.append(
        Row(
            "REINFORCE++ advantages, k1 KL in the reward",
            ours_toml_name(toml),
            f"{ref} kl_penalty + reinforce_plus_plus",
            diff(ours, verl),
        )
    )
    # the adaptive KL controller over a run of steps
    mine = controller(
        load_config_text(
            "[algorithm]\nkl_coef = 0.05\n[algorithm.kl_ctrl]\ntype = 'adaptive'\ntarget_kl = 0.1\nhorizon = 2000\n"
        ).algorithm.kl_ctrl,
        0.05,
    )
    theirs = ca.AdaptiveKLController(init_kl_coef=0.05, target_kl=0.1, horizon=2000)
    worst = 0.0
    for kl in np.random.default_rng(7).uniform(0.0, 0.4, 200):
        mine.update(float(kl), 64)
        theirs.update(float(kl), 64)
        worst = max(worst, abs(mine.value - theirs.value))
    rows.append(Row("Adaptive KL coefficient, 200 steps", "kl_ctrl type = 'adaptive'", f"{ref}.AdaptiveKLController", worst))


def dynamic_sampling_rows(rows: list[Row]) -> None:
    """verl's filter keeps a group when the std of its metric is not 0 (``np.std(values)
    == 0.0`` drops it); ours when max - min > 1e-6, on the metric ``dynamic_sampling_metric`` names."""
    rng = np.random.default_rng(8)
    values = rng.integers(0, 2, size=(64, N)).astype(float)  # accuracy-like scores: many equal groups
    ids = [g for g in range(64) for _ in range(N)]
    kept = set(choose_groups(ids, values.reshape(-1).tolist(), num_groups=64).kept)
    verl_kept = {g for g in range(64) if not float(np.std(values[g])) == 0.0}
    rows.append(
        Row(
            "Dynamic sampling: groups kept",
            "dynamic_sampling_metric",
            "verl's rule as its replay buffer writes it",
            float(len(kept ^ verl_kept)),
            note="groups kept by one only (64 groups)",
        )
    )


# -- TRL -------------------------------------------------------------------------------------------
def trl_rows(rows: list[Row]) -> None:
    try:
        import trl
        from trl.trainer.grpo_trainer import GRPOTrainer
    except Exception as exc:
        rows.append(Row("TRL's GRPOTrainer", "", "trl", note=f"skipped: {type(exc).__name__}: {exc}"))
        return
    ref = f"TRL {trl.__version__} GRPOTrainer._compute_loss"
    data = inputs(1)
    logp, mu, adv, mask = data

    def trl_loss(loss_type: str, eps_low: float, eps_high: float, max_completion_length: int = T):
        def fn(x):
            trainer = SimpleNamespace(
                _get_per_token_logps_and_entropies=lambda *a, **k: (x, torch.zeros_like(x), None),
                top_entropy_quantile=1.0,
                off_policy_mask_threshold=None,
                importance_sampling_level="token",
                beta=0.0,
                args=SimpleNamespace(delta=None, steps_per_generation=1),
                loss_type=loss_type,
                epsilon_low=eps_low,
                epsilon_high=eps_high,
                use_vllm=False,
                vllm_importance_sampling_correction=False,
                model=SimpleNamespace(training=True),
                current_gradient_accumulation_steps=1,
                max_completion_length=max_completion_length,
                accelerator=SimpleNamespace(
                    gather=lambda t: t,
                    gather_for_metrics=lambda t: t,
                    reduce=lambda t, reduction="sum": t,
                    num_processes=1,
                    sync_gradients=True,
                ),
                _entropy_bonus_enabled=False,
                aux_loss_enabled=False,
                _metrics=defaultdict(lambda: defaultdict(list)),
            )
            batch = {
                "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
                "prompt_mask": torch.ones(B, 1, dtype=torch.long),
                "completion_ids": torch.zeros(B, T, dtype=torch.long),
                "completion_mask": mask.long(),
                "advantages": adv[:, 0],
                "old_per_token_logps": mu,
                "num_items_in_batch": mask.sum(),
            }
            return GRPOTrainer._compute_loss(trainer, None, batch)

        return fn

    clip = "[algorithm.loss]\nname = 'ppo_clip'\nclip_low = 0.2\nclip_high = 0.28\n"
    for loss_type, agg in (
        ("grpo", "seq-mean-token-mean"),
        ("bnpo", "token-mean"),
        ("dapo", "token-mean"),
        ("dr_grpo", "seq-mean-token-sum-norm"),
    ):
        compare_loss(
            rows,
            f"TRL loss_type {loss_type}",
            clip + f"agg = '{agg}'\n",
            f"{ref} ({loss_type})",
            trl_loss(loss_type, 0.2, 0.28),
            data,
        )
    compare_loss(
        rows,
        "TRL loss_type cispo",
        "[algorithm.loss]\nname = 'cispo'\nclip_low = 1.0\nclip_high = 4.0\n",
        f"{ref} (cispo, epsilon_high 5)",
        trl_loss("cispo", 0.2, 5.0),
        data,
        note="TRL's epsilon_high is the weight's bound itself, 1 + clip_high; it has no lower bound (clip_low = 1)",
    )


# -- AReaL -----------------------------------------------------------------------------------------
def areal_source(root: Path, path: str) -> tuple[str, str]:
    """The text of ``path`` in AReaL and the commit it is read at."""
    if (root / path).exists():
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        return (root / path).read_text(), commit or "a checkout"
    git = ["git", "--git-dir", str(root)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return subprocess.run([*git, "show", f"HEAD:{path}"], capture_output=True, text=True, check=True).stdout, commit


def load_areal(root: Path) -> tuple[dict, str]:
    """AReaL's functions, executed from its source: functional.py whole (its two areal
    imports given stand-ins), and three functions of actor.py with the constants they use."""
    for name in ("areal", "areal.api", "areal.api.cli_args", "areal.utils", "areal.utils.data"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["areal.api.cli_args"].RejectionSamplingConfig = object  # type: ignore[attr-defined]
    sys.modules["areal.utils.data"].KLEstimator = object  # type: ignore[attr-defined]
    functional, commit = areal_source(root, "areal/utils/functional/functional.py")
    module = types.ModuleType("areal_reference")  # dataclasses look their module up in sys.modules
    sys.modules[module.__name__] = module
    ns = module.__dict__
    exec(compile(functional, "areal/utils/functional/functional.py", "exec"), ns)
    constants, _ = areal_source(root, "areal/utils/constants.py")
    exec(compile(constants, "areal/utils/constants.py", "exec"), ns)
    actor, _ = areal_source(root, "areal/trainer/ppo/actor.py")
    wanted = {"compute_prox_logp_approximations", "_apply_m2po_masking", "_get_m2po_loss_mask"}
    tree = ast.parse(actor)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    exec(compile(ast.Module(body=defs, type_ignores=[]), "areal/trainer/ppo/actor.py", "exec"), ns)
    return ns, commit


def areal_rows(rows: list[Row], root: Path) -> None:
    try:
        ns, commit = load_areal(root)
    except Exception as exc:
        rows.append(Row("AReaL's functions", "", f"AReaL at {root}", note=f"skipped: {type(exc).__name__}: {exc}"))
        return
    ref = f"AReaL {commit[:10]}"
    data = inputs(2, spread=0.3)
    logp, mu, adv, mask = data
    g = torch.Generator().manual_seed(9)
    current = 10
    d_B = torch.randint(0, 5, (B,), generator=g)
    versions = (current - d_B)[:, None].expand(B, T).clone()
    cap = 2.0
    rs = SimpleNamespace(metric="ratio", level="token", action="clamp", upper=cap, lower=None, agg="mean")

    def decoupled(x):
        prox = ns["compute_prox_logp_approximations"](mu, x.detach(), versions, current, method="loglinear")["loglinear"]
        loss, _ = ns["ppo_actor_loss_fn"](
            logprobs=x,
            proximal_logprobs=prox,
            old_logprobs=mu,
            advantages=adv,
            eps_clip=0.2,
            loss_mask=mask.bool(),
            eps_clip_higher=0.28,
            c_clip=3.0,
            rejection_sampling=rs,
        )
        return loss

    toml = (
        "[algorithm]\nclip_against = 'proximal'\nis_truncation = 2.0\n"
        "[algorithm.loss]\nname = 'decoupled_ppo'\nclip_high = 0.28\ndual_clip = 3.0\n"
    )
    staleness = d_B[:, None].double().expand(B, T) * mask
    compare_loss(
        rows,
        "Decoupled PPO, log-linear pi_prox",
        toml,
        f"{ref} compute_prox_logp_approximations + ppo_actor_loss_fn",
        decoupled,
        data,
        staleness=staleness,
        note="AReaL's weight clamp (rejection_sampling action = clamp, upper = 2) is our is_truncation",
    )
    # M2PO: the mask (exact), then the loss on it
    from asyncflow.algorithms.m2po import m2po_keep_mask

    theirs = ns["_apply_m2po_masking"](mu, logp, mask.bool(), 0.04)
    ours_keep = m2po_keep_mask(mu, logp, mask, 0.04)
    rows.append(
        Row(
            "M2PO mask (threshold 0.04)",
            "m2po_keep_mask",
            f"{ref} _apply_m2po_masking",
            float((theirs.double() != ours_keep).sum()),
            note=f"tokens on which the masks differ; {int(mask.sum() - ours_keep.sum())} of {int(mask.sum())} dropped",
        )
    )

    def m2po(x):
        keep = ns["_apply_m2po_masking"](mu, x.detach(), mask.bool(), 0.04)
        loss, _ = ns["ppo_actor_loss_fn"](
            logprobs=x,
            proximal_logprobs=x.detach(),
            old_logprobs=mu,
            advantages=adv,
            eps_clip=0.2,
            loss_mask=keep,
            eps_clip_higher=0.28,
            c_clip=None,
        )
        return loss

    kept = float(ours_keep.sum())
    compare_loss(
        rows,
        "M2PO loss",
        "[algorithm]\nclip_against = 'proximal'\nis_truncation = 0.0\n[algorithm.loss]\nname = 'm2po'\nclip_high = 0.28\n",
        f"{ref} _apply_m2po_masking + ppo_actor_loss_fn",
        m2po,
        data,
        scale=float(mask.sum()) / kept,
        note="AReaL divides by the kept tokens, we by all: ours is compared times all / kept",
    )


# -- output ----------------------------------------------------------------------------------------
def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.1e}"


def markdown(rows: list[Row]) -> str:
    lines = [
        f"Max abs differences, float64, B = {B} rows of 1 to {T} tokens; agreement is both at most {TOL:g}. "
        "Generated by `PYTHONPATH=. python scripts/reference_check.py --write-docs`.",
        "",
        "| quantity | asyncflow (`[algorithm]`) | reference | max abs diff, value | max abs diff, gradient | |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        status = r.status + (f": {r.note}" if r.note else "")
        lines.append(f"| {r.quantity} | `{r.ours}` | {r.reference} | {fmt(r.value_diff)} | {fmt(r.grad_diff)} | {status} |")
    lines += [""] + [f"- {n}" for n in NOTES]
    return "\n".join(lines).rstrip() + "\n"


def text(rows: list[Row]) -> str:
    out = [f"{'quantity':48} {'value':>9} {'grad':>9}  status"]
    for r in rows:
        out.append(
            f"{r.quantity[:48]:48} {fmt(r.value_diff):>9} {fmt(r.grad_diff):>9}  {r.status}{': ' + r.note if r.note else ''}"
        )
    return "\n".join(out + [f"note: {n}" for n in NOTES])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--write-docs", action="store_true", help=f"replace the table in {DOCS.name}")
    default = os.environ.get("AREAL_SRC", "/work/.mirror/inclusionAI+AReaL/repo")
    parser.add_argument("--areal", type=Path, default=Path(default), help="AReaL checkout or git directory")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows: list[Row] = []
    verl_rows(rows)
    dynamic_sampling_rows(rows)
    trl_rows(rows)
    areal_rows(rows, args.areal)
    table = markdown(rows)
    if args.write_docs:
        doc = DOCS.read_text()
        if BEGIN not in doc:
            raise SystemExit(f"{DOCS} has no {BEGIN} ... {END} block to fill")
        DOCS.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), BEGIN + "\n" + table + END, doc, flags=re.S))
    print(table if args.markdown or args.write_docs else text(rows))
    return 1 if any(r.status == "DIFFERS" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
