"""Small rows carried with their notices (tq/inline.py): the cache in the controller,
the merge of notices, and the reply over real sockets."""

from __future__ import annotations

import numpy as np
import pytest

from asyncflow.core import protocol, tensors
from asyncflow.core.tq.inline import InlineCache
from asyncflow.core.tq.notify import merge


def _cell(values) -> protocol.Tensor:
    return tensors.to_wire(np.asarray(values, dtype=np.int64))


@pytest.mark.timeout(10)
def test_the_cache_answers_only_when_it_holds_every_cell_and_forgets_overwritten_and_acked_ones():
    cache = InlineCache(max_bytes=1 << 20)
    cache.wanted = {"a", "b"}
    cache.on_written([0, 1], ["a", "b"], {"a": [_cell([1]), _cell([2])], "b": [_cell([3]), _cell([4])]})
    got = cache.take([1, 0], ["b", "a"])
    assert [tensors.to_numpy(t).tolist() for t in got["b"]] == [[4], [3]]
    assert cache.take([0, 2], ["a"]) == {}  # row 2 never came inline: read from the shard
    cache.on_written([0], ["a"], {})  # column a of row 0 written again, too big to carry
    assert cache.take([0], ["a"]) == {} and cache.take([0], ["b"]) != {}
    cache.drop([0, 1])
    assert cache.take([1], ["a"]) == {} and cache.num_bytes == 0


@pytest.mark.timeout(10)
def test_the_cache_keeps_to_its_budget_and_copies_cells_out_of_the_received_message():
    cache = InlineCache(max_bytes=16)  # two int64 cells
    cache.wanted = {"a"}
    frame = bytearray(np.arange(3, dtype=np.int64).tobytes())
    cells = [protocol.Tensor(dtype="int64", shape=[1], data=memoryview(frame)[8 * k : 8 * k + 8]) for k in range(3)]
    cache.on_written([0, 1, 2], ["a"], {"a": cells})
    assert cache.num_bytes == 16 and cache.take([2], ["a"]) == {}
    frame[:] = bytes(len(frame))  # the message buffer reused: the cache's copies are intact
    assert tensors.to_numpy(cache.take([1], ["a"])["a"][0]).tolist() == [1]


@pytest.mark.timeout(10)
def test_the_cache_keeps_only_columns_its_task_asks_for_and_rows_it_has_not_finished():
    cache = InlineCache()
    cache.wanted = {"a"}
    cache.on_written(
        [0, 1], ["a", "z"], {"a": [_cell([1]), _cell([2])], "z": [_cell([3]), _cell([4])]}, skip=lambda i: i == 1
    )  # row 1 already acked by this task
    assert cache.take([0], ["a"]) != {} and cache.take([0], ["z"]) == {} and cache.take([1], ["a"]) == {}
    assert cache.num_bytes == 8


@pytest.mark.timeout(10)
def test_merged_notices_keep_inline_cells_and_a_notice_without_them_stays_apart():
    a = protocol.RowsWritten(shard=0, indices=[0], columns=["a"], inline={"a": [_cell([1])]})
    b = protocol.RowsWritten(shard=0, indices=[1], columns=["a"], inline={"a": [_cell([2])]})
    c = protocol.RowsWritten(shard=0, indices=[2], columns=["a"])
    both = merge(a, b)
    assert both.indices == [0, 1] and len(both.inline["a"]) == 2
    assert merge(both, c) is None and merge(c, both) is None  # merged, both's cells would be lost


@pytest.mark.timeout(60)
def test_small_rows_come_in_the_reply_big_ones_from_the_shard_both_intact(tmp_path):
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.tq.client import TQClient
    from asyncflow.core.tq.launch import spawn_queue
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    queue = spawn_queue(dc, transport, ["train"], num_shards=1, capacity_rows=64, inline_max_bytes=1024)
    tq = TQClient(dc, reserve_rows=0)
    try:
        # the controller keeps the small cells of the columns its task has asked for
        assert tq.get_meta("train", ["x"], 4, partial=True, min_step=99).indices == []
        rng = np.random.default_rng(0)
        small = tq.allocate(4, step=0)
        small_cells = [rng.integers(0, 100, 8) for _ in small]  # 4 x 64 bytes: carried inline
        tq.put([m.index for m in small], {"x": small_cells}, small)
        # taken before the big put: the shard's two notices could otherwise be merged into one
        # (notify.py lingers to batch them), which carries no cells inline, by design
        meta = tq.get_meta("train", ["x"], 4, min_step=0, max_step=0, timeout_s=10)
        assert list(meta.columns) == ["x"]
        got = tq.read_batch(meta, ["x"])["x"]
        assert all(np.array_equal(g, c) for g, c in zip(got, small_cells))
        big = tq.allocate(4, step=1)
        big_cells = [rng.integers(0, 100, 64) for _ in big]  # 4 x 512 bytes: read from the shard
        tq.put([m.index for m in big], {"x": big_cells}, big)
        meta = tq.get_meta("train", ["x"], 4, min_step=1, max_step=1, timeout_s=10, ack=meta.indices)
        assert meta.columns == {}
        got = tq.read_batch(meta, ["x"], positions=[3, 0])["x"]
        assert np.array_equal(got[0], big_cells[3]) and np.array_equal(got[1], big_cells[0])
    finally:
        tq.close()
        queue.stop()
        directory.stop()
