"""An example custom role: a judge that prefers short answers.

It reads each response once (from its own queue task) and writes a score of
-0.05 per token beyond ``target_tokens``; the trainer adds it to the reward. The
task and the output column come from the config entry (``task``,
``reward_column``): see examples/custom_role.toml and docs/custom-roles.md.
"""

from __future__ import annotations

from asyncflow.actors.roles.column_role import ColumnRole


class BrevityJudge(ColumnRole):
    inputs = ("response_ids",)

    def __init__(self, ctx, run_dir: str, target_tokens: int = 3, **kwargs):
        super().__init__(ctx, run_dir, **kwargs)
        self.target_tokens = target_tokens

    def score(self, columns, metas):
        return [-0.05 * max(0, len(ids) - self.target_tokens) for ids in columns["response_ids"]]
