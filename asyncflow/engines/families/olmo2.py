"""OLMo 2 and OLMo 3: no norm before attention or MLP; each output is normalised before
it joins the residual; q and k are normalised over the whole projection. OLMo 3's
sliding-window layers and their rope come from the config."""

from asyncflow.engines.families._block import Block

OLMO2 = Block(
    attn_in_norm=None,
    attn_out_norm="post_attention_layernorm",
    mlp_in_norm=None,
    mlp_out_norm="post_feedforward_layernorm",
    qk_norm="projection",
)
