"""The example brevity judge, held after it has scored ``hold_after`` rows until the
file ``gate`` exists: a run cannot finish while a test still has to act on it
mid-run (tests/runs/test_e2e.py kills processes there; tiny steps take ~20 ms, so
without the hold a loaded machine could end the whole run before the kill lands).

Needs examples/roles on ``[cluster] python_path`` beside this directory. A restarted
judge counts from 0, and the test creates the gate before it comes back.
"""

from __future__ import annotations

import time
from pathlib import Path

from brevity_judge import BrevityJudge

POLL_S = 0.01
"""How often a held judge looks for the gate file (in the role's process)."""


class GatedJudge(BrevityJudge):
    def __init__(self, ctx, run_dir: str, gate: str, hold_after: int, **kwargs):
        super().__init__(ctx, run_dir, **kwargs)
        self.gate, self.hold_after, self.scored = Path(gate), hold_after, 0

    def score(self, columns, metas):
        while self.scored >= self.hold_after and not self.gate.exists():
            time.sleep(POLL_S)
        self.scored += len(columns["response_ids"])
        return super().score(columns, metas)
