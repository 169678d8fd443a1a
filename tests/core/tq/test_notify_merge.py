"""The shard's notifier merges RowsWritten notices queued while it was busy: every row's
inline cells reach the controller, whether its put carried them or a neighbour's did not."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from asyncflow.core import protocol, tensors
from asyncflow.core.tq.notify import Notifier, merge
from asyncflow.core.transport import TransportConfig


def _cell(value: int) -> protocol.Tensor:
    return tensors.to_wire(np.asarray([value], dtype=np.int64))


def _small(index: int) -> protocol.RowsWritten:
    """A put small enough to carry its cells."""
    return protocol.RowsWritten(shard=0, indices=[index], columns=["x"], inline={"x": [_cell(index)]})


def _big(index: int) -> protocol.RowsWritten:
    """A put too big to carry its cells (read from the shard)."""
    return protocol.RowsWritten(shard=0, indices=[index], columns=["x"])


def _cells_by_row(notices) -> dict[int, int]:
    """row -> the value of its inline cell, over every notice (each row's cell exactly where its notice says)."""
    out: dict[int, int] = {}
    for notice in notices:
        for name, cells in notice.inline.items():
            assert len(cells) == len(notice.indices), f"{name}: {len(cells)} cells for rows {notice.indices}"
            for index, cell in zip(notice.indices, cells):
                assert index not in out
                out[index] = int(tensors.to_numpy(cell)[0])
    return out


class _Receiver:
    """A stand-in for the controller's ref: records each notice; the first one waits for ``release``."""

    config = TransportConfig(scheme="inproc", freeze_timeout_s=0.0)
    name, address = "controller", "inproc://controller"

    def __init__(self):
        self.received: list[protocol.RowsWritten] = []
        self.first_arrived, self.release = threading.Event(), threading.Event()

    def tell(self, msg, timeout_s, sender="", seq=0):
        self.received.append(msg)
        if len(self.received) == 1:
            self.first_arrived.set()
            assert self.release.wait(5.0)


@pytest.mark.timeout(10)
def test_a_merge_of_a_notice_with_cells_and_one_without_keeps_every_cell():
    for first, second in ((_small(0), _big(1)), (_big(0), _small(1))):
        merged = merge(first, second)
        notices = [first, second] if merged is None else [merged]
        assert _cells_by_row(notices) == _cells_by_row([first, second]), (first, second, merged)


@pytest.mark.timeout(10)
def test_notices_queued_while_the_sender_was_busy_reach_the_controller_with_every_inline_cell():
    receiver = _Receiver()
    notifier = Notifier("shard.0", resolve=lambda name: receiver, transport=receiver.config)
    try:
        notifier.tell("controller", _small(0))
        assert receiver.first_arrived.wait(5.0)  # the sender is busy with row 0: the rest queue up
        queued = [_big(1), _small(2), _small(3), _big(4), _small(5)]
        for notice in queued:
            notifier.tell("controller", notice)
        receiver.release.set()
        notifier.flush(timeout_s=5.0)
    finally:
        receiver.release.set()
        notifier.close()
    assert [i for n in receiver.received for i in n.indices] == [0, 1, 2, 3, 4, 5]  # in order, each once
    assert _cells_by_row(receiver.received) == {0: 0, 2: 2, 3: 3, 5: 5}
    assert len(receiver.received) < 1 + len(queued)  # notices of the same kind were still merged
