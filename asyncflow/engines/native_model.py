"""A lean decoder forward over a Hugging Face causal LM's own weights, reading and
writing a paged KV cache (``KVBlockPool``), for every family in ``engines/families``.

Shape legend: B sequences, Q new tokens per sequence this call (padded), K key
positions (padded), H query heads, Hkv key/value heads, D head dim, R rotary dims
(D, or fewer with partial rotary), E hidden, V vocab, N token rows (B * Q), X experts.

One layer, whatever the family (its ``Block`` says which norms exist and how the
projections are stored; the numbers come from the config and modules)::

    h = attn_in_norm(x);  q, k, v = proj(h);  q, k = qk_norm(q, k);  q, k = rope(q, k)
    a = attention(q, cache(k), cache(v); scale, soft-cap, sliding window)
    x = x + attn_out_norm(o_proj(a))
    h = mlp_in_norm(x);  x = x + mlp_out_norm(mlp(h))    # gated MLP, or MoE + shared expert

Invariants:
- The weights are the HF modules' parameters, used in place: loading new weights
  into the HF model changes what this forward computes, with no copy to refresh.
- ``step`` writes the K/V of every valid new token into its slot before attending,
  and a query at position p attends exactly the keys at positions 0..p of its own
  sequence, or p - window + 1..p in a sliding-window layer (causal, no cross-sequence
  leakage through padding). The cache keeps every position: a window bounds what is
  attended, not what is stored.
- Rotary tables come from the model's own rotary module (any static rope scaling:
  llama3, yarn, linear; one table per layer type where the family has several);
  rope types that depend on the sequence length are refused by ``families``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from asyncflow.engines.families import Block, block_of
from asyncflow.engines.kv_cache import KVBlockPool


@torch.library.custom_op("asyncflow::rms_norm", mutates_args=())
def _eager_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``F.rms_norm`` over the last dim, opaque to ``torch.compile``: a compiled graph calls
    the eager kernel. Inductor otherwise fuses the norm's sum of squares into its own
    loop, summed in another order: 1e-7 relative per norm, which SmolLM2-135M's 61 norms
    compounded into a 1e-5 log-prob gap between a compiled decode step and eager."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


@_eager_rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def _plain_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rms_norm(x: torch.Tensor, norm: Any, offset: float) -> torch.Tensor:
    """An HF RMSNorm module applied with its own eps, scaling by ``offset + weight``;
    traced by ``torch.compile``, the very kernel eager runs (``_eager_rms_norm``)."""
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = norm.eps
    rms_norm = _eager_rms_norm if torch.compiler.is_compiling() else _plain_rms_norm
    if offset == 0.0:
        return rms_norm(x, norm.weight, eps)
    # (1 + w) in float32, as Gemma computes it: w is small, and 1 + w in bfloat16 keeps 8 bits of it
    return rms_norm(x.float(), norm.weight.float() + offset, eps).to(x.dtype)


@dataclass
class _Layer:
    """One decoder layer's modules and settings, looked up once."""

    module: Any
    rope: str  # key of its rotary table ("" when the layer has no rope)
    window: int | None  # sliding window (keys within ``window`` positions), None: global
    scale: float
    softcap: float | None
    moe: bool


class NativeDecoder:
    def __init__(self, hf_model: torch.nn.Module):
        # a Hugging Face causal LM: torch types its submodules (model.layers, rotary_emb) as Tensor | Module
        config: Any = hf_model.config
        self.block: Block = block_of(config.to_dict())
        self.model: Any = hf_model
        self.config = config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_layers = config.num_hidden_layers
        self.max_positions = config.max_position_embeddings
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        base: Any = hf_model.model
        param = next(hf_model.parameters())
        self.cos_PR: dict[str, torch.Tensor] = {}
        self.sin_PR: dict[str, torch.Tensor] = {}
        layer_types = list(getattr(config, "layer_types", None) or ["full_attention"] * self.num_layers)
        per_type = "layer_type" in inspect.signature(base.rotary_emb.forward).parameters
        with torch.no_grad():
            pos = torch.arange(self.max_positions, device=param.device).unsqueeze(0)
            x = torch.zeros(1, dtype=param.dtype, device=param.device)
            for kind in sorted(set(layer_types)) if per_type else ["all"]:
                cos, sin = base.rotary_emb(x, pos, kind) if per_type else base.rotary_emb(x, pos)
                self.cos_PR[kind], self.sin_PR[kind] = cos[0], sin[0]
        self.layers = [self._layer(i, layer, layer_types[i], per_type) for i, layer in enumerate(base.layers)]

    def _layer(self, i: int, layer: Any, layer_type: str, per_type: bool) -> _Layer:
        attn = layer.self_attn
        if hasattr(attn, "sliding_window"):  # families that set it per layer (None on global layers)
            window = attn.sliding_window
        else:  # families with one window for every layer (Mistral, Phi-3, Mixtral) or none
            window = getattr(self.config, "sliding_window", None)
        return _Layer(
            module=layer,
            rope=(layer_type if per_type else "all") if getattr(attn, "use_rope", True) else "",
            window=int(window) if window else None,
            scale=float(getattr(attn, "scaling", self.head_dim**-0.5)),
            softcap=getattr(attn, "attn_logit_softcapping", None) or None,
            moe=hasattr(layer.mlp, "experts"),
        )

    @property
    def device(self) -> torch.device:
        return self.model.model.embed_tokens.weight.device

    @staticmethod
    def _rope(x_BQHD: torch.Tensor, cos_BQ1R: torch.Tensor, sin_BQ1R: torch.Tensor) -> torch.Tensor:
        """Rotate the first R dims of each head (all of them unless partial rotary)."""
        R = cos_BQ1R.shape[-1]
        rot, rest = (x_BQHD, None) if R == x_BQHD.shape[-1] else (x_BQHD[..., :R], x_BQHD[..., R:])
        half = R // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        out = rot * cos_BQ1R + rotated * sin_BQ1R
        return out if rest is None else torch.cat((out, rest), dim=-1)

    def _qkv(self, attn: Any, h: torch.Tensor, B: int, Q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        if self.block.fused_qkv:
            q, k, v = F.linear(h, attn.qkv_proj.weight, attn.qkv_proj.bias).split((H * D, Hkv * D, Hkv * D), dim=-1)
        else:
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias)
        offset = self.block.norm_offset
        if self.block.qk_norm == "projection":
            q, k = _rms_norm(q, attn.q_norm, offset), _rms_norm(k, attn.k_norm, offset)
        q, k, v = q.view(B, Q, H, D), k.view(B, Q, Hkv, D), v.reshape(B, Q, Hkv, D)
        if self.block.qk_norm == "head":
            q, k = _rms_norm(q, attn.q_norm, offset), _rms_norm(k, attn.k_norm, offset)
        return q, k, v

    def _mlp(self, mlp: Any, h: torch.Tensor) -> torch.Tensor:
        if self.block.fused_gate_up:
            gate, up = F.linear(h, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias).chunk(2, dim=-1)
        else:
            gate = F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias)
        act = getattr(mlp, "act_fn", None) or mlp.activation_fn
        return F.linear(act(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)

    def _moe(self, moe: Any, h_BQE: torch.Tensor) -> torch.Tensor:
        """Top-k experts per token, weighted by the router's softmax (renormalised over the
        k where the family does), plus the shared expert where the layer has one. Each
        expert runs once on the rows routed to it."""
        h_NE = h_BQE.reshape(-1, h_BQE.shape[-1])
        experts = moe.experts
        router = moe.gate
        probs_NX = torch.softmax(F.linear(h_NE, router.weight).float(), dim=-1)
        weight_Nk, expert_Nk = torch.topk(probs_NX, router.top_k, dim=-1)
        if self.block.moe_renormalize == "always" or getattr(self.config, "norm_topk_prob", False):
            weight_Nk = weight_Nk / weight_Nk.sum(dim=-1, keepdim=True)
        weight_Nk = weight_Nk.to(h_NE.dtype)
        out_NE = torch.zeros_like(h_NE)
        for x in expert_Nk.unique().tolist():
            row, slot = torch.where(expert_Nk == x)
            gate, up = F.linear(h_NE[row], experts.gate_up_proj[x]).chunk(2, dim=-1)
            y = F.linear(experts.act_fn(gate) * up, experts.down_proj[x])
            out_NE.index_add_(0, row, y * weight_Nk[row, slot, None])
        shared = getattr(moe, "shared_expert", None)
        if shared is not None:
            out_NE = out_NE + torch.sigmoid(F.linear(h_NE, moe.shared_expert_gate.weight)) * self._mlp(shared, h_NE)
        return out_NE.view_as(h_BQE)

    def _attend(
        self, L: _Layer, q_BHQD: torch.Tensor, k_BHKD: torch.Tensor, v_BHKD: torch.Tensor, mask_B1QK: torch.Tensor
    ) -> torch.Tensor:
        gqa = self.num_heads != self.num_kv_heads
        if L.softcap is None:
            return F.scaled_dot_product_attention(q_BHQD, k_BHKD, v_BHKD, attn_mask=mask_B1QK, scale=L.scale, enable_gqa=gqa)
        # soft-capped logits (Gemma 2): cap * tanh(s / cap) before the mask; SDPA has no such hook
        rep = self.num_heads // self.num_kv_heads
        k_BHKD = k_BHKD.repeat_interleave(rep, dim=1) if gqa else k_BHKD
        v_BHKD = v_BHKD.repeat_interleave(rep, dim=1) if gqa else v_BHKD
        s_BHQK = torch.matmul(q_BHQD, k_BHKD.transpose(-1, -2)) * L.scale
        s_BHQK = torch.tanh(s_BHQK / L.softcap) * L.softcap
        s_BHQK = s_BHQK.masked_fill(~mask_B1QK, -math.inf)
        return torch.matmul(torch.softmax(s_BHQK.float(), dim=-1).to(q_BHQD.dtype), v_BHKD)

    @torch.inference_mode()
    def step(
        self,
        pool: KVBlockPool,
        ids_BQ: torch.Tensor,
        pos_BQ: torch.Tensor,
        valid_BQ: torch.Tensor | None,
        slot_table_BK: torch.Tensor,
        last_B: torch.Tensor,
    ) -> torch.Tensor:
        """Feed Q new tokens per sequence; return float32 logits [B, V] at index
        ``last_B`` (the last valid new token of each sequence).

        ``pos_BQ``: absolute positions of the new tokens. ``valid_BQ``: which are real
        (None: all). ``slot_table_BK``: cache slot of key position k for each
        sequence, K >= max position + 1."""
        return self.forward(pool, ids_BQ, pos_BQ, valid_BQ, slot_table_BK, last_B)

    def forward(
        self,
        pool: KVBlockPool,
        ids_BQ: torch.Tensor,
        pos_BQ: torch.Tensor,
        valid_BQ: torch.Tensor | None,
        slot_table_BK: torch.Tensor,
        last_B: torch.Tensor,
        new_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """``step`` without its inference mode: what a compiled decode step traces
        (engines/compiled_decode.py), under the caller's mode.

        ``new_kv`` (one new token per sequence, all valid): the pool is only read; each
        layer's new keys and values ``[B, 1, Hkv, D]`` are appended to it for the caller
        to write, and attention sees them in their slots' place, so the logits are the
        ones the writes would give. A graph that mutates nothing copies nothing."""
        m = self.model.model
        block = self.block
        B, Q = ids_BQ.shape
        K = slot_table_BK.shape[1]
        Hkv, D = self.num_kv_heads, self.head_dim
        slot_BQ = torch.gather(slot_table_BK, 1, pos_BQ)
        write_slots = slot_BQ.reshape(-1) if valid_BQ is None else slot_BQ[valid_BQ]
        # Key k is visible to query q iff k <= pos[q] (and, in a sliding-window layer,
        # k > pos[q] - window); keys past a sequence's length are beyond every one of
        # its query positions, so padding is never attended.
        k_11K = torch.arange(K, device=ids_BQ.device).view(1, 1, K)
        pos_BQ1 = pos_BQ.unsqueeze(-1)
        causal_BQK = k_11K <= pos_BQ1
        fresh_BK11 = None if new_kv is None else (k_11K == pos_BQ1).view(B, K, 1, 1)  # Q == 1
        masks: dict[int | None, torch.Tensor] = {None: causal_BQK.unsqueeze(1)}
        # index_select on the flat slot list: 5x faster than advanced indexing on a CPU
        # (the gather of every layer's keys and values was 7% of a real-size rollout)
        read_slots = slot_table_BK.reshape(-1)
        cos = {kind: t[pos_BQ].unsqueeze(2) for kind, t in self.cos_PR.items()}
        sin = {kind: t[pos_BQ].unsqueeze(2) for kind, t in self.sin_PR.items()}
        x_BQE = m.embed_tokens(ids_BQ)
        offset = block.norm_offset
        for i, L in enumerate(self.layers):
            layer = L.module
            attn = layer.self_attn
            h = x_BQE if block.attn_in_norm is None else _rms_norm(x_BQE, getattr(layer, block.attn_in_norm), offset)
            q, k, v = self._qkv(attn, h, B, Q)
            if L.rope:
                q, k = self._rope(q, cos[L.rope], sin[L.rope]), self._rope(k, cos[L.rope], sin[L.rope])
            if fresh_BK11 is None:
                pool.k[i, write_slots] = k.reshape(-1, Hkv, D) if valid_BQ is None else k[valid_BQ]
                pool.v[i, write_slots] = v.reshape(-1, Hkv, D) if valid_BQ is None else v[valid_BQ]
            keys = pool.k[i].index_select(0, read_slots).view(B, K, Hkv, D)
            values = pool.v[i].index_select(0, read_slots).view(B, K, Hkv, D)
            if fresh_BK11 is not None and new_kv is not None:
                keys, values = torch.where(fresh_BK11, k, keys), torch.where(fresh_BK11, v, values)
                new_kv.append((k, v))
            keys, values = keys.transpose(1, 2), values.transpose(1, 2)
            if L.window is not None and L.window not in masks:
                masks[L.window] = (causal_BQK & (k_11K > pos_BQ1 - L.window)).unsqueeze(1)
            out = self._attend(L, q.transpose(1, 2), keys, values, masks[L.window])  # [B, H, Q, D]
            out = F.linear(out.transpose(1, 2).reshape(B, Q, -1), attn.o_proj.weight, attn.o_proj.bias)
            if block.attn_out_norm is not None:
                out = _rms_norm(out, getattr(layer, block.attn_out_norm), offset)
            x_BQE = x_BQE + out
            h = x_BQE if block.mlp_in_norm is None else _rms_norm(x_BQE, getattr(layer, block.mlp_in_norm), offset)
            out = self._moe(layer.mlp, h) if L.moe else self._mlp(layer.mlp, h)
            if block.mlp_out_norm is not None:
                out = _rms_norm(out, getattr(layer, block.mlp_out_norm), offset)
            x_BQE = x_BQE + out
        x_BE = x_BQE[torch.arange(B, device=ids_BQ.device), last_B]
        x_BE = _rms_norm(x_BE, m.norm, offset)
        head = self.model.lm_head
        logits_BV = F.linear(x_BE, head.weight, head.bias).float()
        if self.final_softcap:
            logits_BV = torch.tanh(logits_BV / self.final_softcap) * self.final_softcap
        return logits_BV
