"""Log-probs and entropies of the tokens a policy produced, from the decoder's hidden states
and the LM head's weight, a chunk of token positions at a time (``train.engine.logit_chunk``).

Shape legend: N token positions, E hidden, V vocabulary.

The plain path forms the float32 logits [N, V] of every position at once, then a
log-softmax, a gather and (for the entropy) ``exp`` and a product over [N, V], and autograd
keeps several such tensors for the backward: over a 49k vocabulary, 64 rows of 16 response
tokens hold 200 MB each. Here ``forward`` keeps only the log-sum-exp and the entropy of each
position (N floats), and ``backward`` forms each chunk's logits again and turns them into the
gradients of the hidden states and the weight at once:

- ``logp_n = z_n[target_n] - lse_n``, ``H_n = -sum_v p_nv log p_nv``, ``z = h W^T / temperature``;
- ``d logp_n / d z_nv = [v = target_n] - p_nv``;
- ``d H_n / d z_nv = -p_nv (log p_nv + H_n)``.

Invariants: the logits are computed in the weight's dtype and taken to float32, as the
plain path's head does (float32 under autocast: the engine passes float32 hidden states and
weight); the results equal the plain path's up to float rounding (tests/engines/test_train_speed_paths.py).
"""

from __future__ import annotations

from typing import Any

import torch


def _logits(hidden_NE: torch.Tensor, weight_VE: torch.Tensor, temperature: float) -> torch.Tensor:
    z_NV = (hidden_NE @ weight_VE.t()).float()
    if temperature not in (0.0, 1.0):
        z_NV = z_NV / temperature
    return z_NV


class _HeadLogp(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden_NE: torch.Tensor,
        weight_VE: torch.Tensor,
        target_N: torch.Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        N = hidden_NE.shape[0]
        logp_N = torch.empty(N, dtype=torch.float32, device=hidden_NE.device)
        lse_N = torch.empty_like(logp_N)
        entropy_N = torch.zeros_like(logp_N)
        for s in range(0, N, chunk):
            z_CV = _logits(hidden_NE[s : s + chunk], weight_VE, temperature)
            lse_C = torch.logsumexp(z_CV, dim=-1)
            lse_N[s : s + chunk] = lse_C
            logp_N[s : s + chunk] = z_CV.gather(1, target_N[s : s + chunk, None]).squeeze(1) - lse_C
            if with_entropy:
                logp_CV = z_CV.sub_(lse_C[:, None])
                entropy_N[s : s + chunk] = -(logp_CV.exp() * logp_CV).sum(-1)
        ctx.save_for_backward(hidden_NE, weight_VE, target_N, lse_N, entropy_N)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        return logp_N, entropy_N

    @staticmethod
    def backward(ctx: Any, g_logp_N: torch.Tensor, g_entropy_N: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden_NE, weight_VE, target_N, lse_N, entropy_N = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        scale = 1.0 / temperature if temperature not in (0.0, 1.0) else 1.0
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden_NE) if want_h else None
        grad_w = torch.zeros_like(weight_VE, dtype=torch.float32) if want_w else None
        entropy_used = ctx.with_entropy and g_entropy_N is not None
        for s in range(0, hidden_NE.shape[0], chunk):
            h_CE = hidden_NE[s : s + chunk]
            g_C = g_logp_N[s : s + chunk, None].float() if g_logp_N is not None else torch.zeros_like(lse_N[s : s + chunk, None])
            logp_CV = _logits(h_CE, weight_VE, temperature).sub_(lse_N[s : s + chunk, None])
            p_CV = logp_CV.exp()
            if entropy_used:
                # -p (g_logp + g_H (log p + H)), then + g_logp at the target
                gz_CV = logp_CV.add_(entropy_N[s : s + chunk, None]).mul_(g_entropy_N[s : s + chunk, None].float())
                gz_CV = gz_CV.add_(g_C).mul_(p_CV).neg_()
            else:
                gz_CV = p_CV.mul_(g_C).neg_()
            gz_CV.scatter_add_(1, target_N[s : s + chunk, None], g_C)
            if scale != 1.0:
                gz_CV.mul_(scale)
            gz_CV = gz_CV.to(weight_VE.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = gz_CV @ weight_VE
            if grad_w is not None:
                grad_w.addmm_(gz_CV.t(), h_CE.to(weight_VE.dtype))
        return grad_h, (grad_w.to(weight_VE.dtype) if grad_w is not None else None), None, None, None, None


def head_logp(
    hidden_BTE: torch.Tensor,
    weight_VE: torch.Tensor,
    target_BT: torch.Tensor,
    temperature: float,
    chunk: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp_BT, entropy_BT or None)``: the log-prob of ``target_BT[b, t]`` under
    ``hidden_BTE[b, t] @ weight_VE^T / temperature`` and that distribution's entropy, float32,
    ``chunk`` positions' logits at a time (``token_logp`` and ``token_entropy`` of the logits)."""
    B, T, E = hidden_BTE.shape
    if B * T == 0:
        empty = torch.zeros(B, T, dtype=torch.float32, device=hidden_BTE.device)
        return empty, (empty.clone() if with_entropy else None)
    logp_N, entropy_N = _HeadLogp.apply(
        hidden_BTE.reshape(B * T, E), weight_VE, target_BT.reshape(B * T), temperature, max(chunk, 1), with_entropy
    )
    return logp_N.reshape(B, T), (entropy_N.reshape(B, T) if with_entropy else None)
