"""The emulated uplink of a weight sender (``actors/weights/_link.py``, ``afctl bench fanout
--link-mb-s``): chunks leave one after another at the link's rate. A fake clock: no sleeps."""

from __future__ import annotations

import pytest

from asyncflow.actors.weights._link import EmulatedLink


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.timeout(10)
def test_chunks_sent_together_leave_one_after_another_and_an_idle_link_starts_afresh():
    clock = Clock()
    link = EmulatedLink(mb_per_s=2.0, clock=clock)  # 2e6 bytes a second
    assert link.delay_s(1_000_000) == pytest.approx(0.5)
    assert link.delay_s(1_000_000) == pytest.approx(1.0)  # behind the first
    clock.now += 0.25
    assert link.delay_s(500_000) == pytest.approx(1.0)  # 0.75 s still queued, then its own 0.25 s
    clock.now += 10.0  # idle: the queue has drained
    assert link.delay_s(2_000_000) == pytest.approx(1.0)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_a_link_without_a_rate_is_refused(rate):
    with pytest.raises(ValueError, match="above 0 MB/s"):
        EmulatedLink(mb_per_s=rate)
