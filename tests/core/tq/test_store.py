"""A shard's store without sockets: inline cells, arena cells, freeing, save/load."""

import os

import numpy as np
import pytest

from asyncflow.core.protocol import RowMeta, ShmColumn
from asyncflow.core.tensors import to_numpy, to_wire
from asyncflow.core.tq import shm
from asyncflow.core.tq.store import ShardStore


def test_put_get_free_keep_count_of_bytes():
    s = ShardStore("s")
    s.put([1, 2], {"a": [to_wire(np.arange(3)), to_wire(np.arange(5))]}, [RowMeta(index=1, version=4)])
    s.put([2], {"b": [to_wire(np.ones(2, np.float32))]})
    assert s.num_bytes == 8 * 8 + 8
    inline, shm_cols, _ = s.get([2, 1], ["a"])
    assert [to_numpy(t).tolist() for t in inline["a"]] == [list(range(5)), list(range(3))]
    assert not shm_cols and s.meta(1).version == 4
    with pytest.raises(KeyError, match=r"rows \[1\] have no column 'b'"):
        s.get([1], ["b"])
    s.put([1], {"a": [to_wire(np.arange(1))]})  # overwrite
    assert s.num_bytes == 8 + 5 * 8 + 8
    assert s.free([1, 2, 3]) == 2 and s.num_bytes == 0 and s.peak_bytes == 8 * 8 + 8
    with pytest.raises(KeyError, match="row 1 is not here"):
        s.get([1], ["a"])


def _shm_put(store, indices, arrays):
    total = sum(shm.align(a.nbytes) for a in arrays)
    segment, base = store.reserve(total)
    arena = shm.MAPPINGS.get(segment)
    offsets, pos = [], base
    for a in arrays:
        arena[pos : pos + a.nbytes] = a.view(np.uint8).reshape(-1)
        offsets.append(pos)
        pos += shm.align(a.nbytes)
    col = ShmColumn(dtype=arrays[0].dtype.name, shapes=[a.shape for a in arrays], segments=[0] * len(arrays), offsets=offsets)
    store.put_shm(indices, segment, base, total, {"x": col})
    return segment, base


@pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")
def test_arena_extents_are_reused_once_their_rows_are_freed_and_unlinked_on_close():
    s = ShardStore("shm-test", arena_bytes=1 << 20)
    segment, first = _shm_put(s, [0, 1], [np.arange(10), np.arange(20)])
    inline, cols, segments = s.get([1, 0], ["x"], allow_shm=True)
    assert not inline and segments == [segment] and cols["x"].shapes == [(20,), (10,)]
    inline, _, _ = s.get([1], ["x"], allow_shm=False)  # a remote reader gets the bytes
    assert to_numpy(inline["x"][0]).tolist() == list(range(20))
    _, second = _shm_put(s, [2], [np.arange(4)])
    assert second != first
    s.free([0])
    assert s.reserve(100)[1] != first  # row 1 still holds the first extent
    s.free([1])
    assert s.reserve(100) == (segment, first)
    assert os.path.exists(shm.path_of(segment))
    s.close()
    assert not os.path.exists(shm.path_of(segment))


def test_arena_allocator_merges_free_neighbours():
    a = shm.Arena(f"{shm.PREFIX}alloc-test-{os.getpid()}", 4 * 4096)
    try:
        offs = [a.alloc(4096) for _ in range(4)]
        assert offs == [0, 4096, 8192, 12288] and a.alloc(1) is None
        a.free(4096, 4096)
        a.free(8192, 4096)
        assert a.alloc(8192) == 4096
        a.free(0, 4096)
        a.free(4096, 8192)
        a.free(12288, 4096)
        assert a.alloc(4 * 4096) == 0 and a.top_bytes == 4 * 4096
    finally:
        a.unlink()


def test_save_and_load_keep_rows_columns_and_metas(tmp_path):
    s = ShardStore("s")
    s.put([3, 4], {"a": [to_wire(np.arange(3)), to_wire(np.zeros((2, 2), np.float16))]}, [RowMeta(index=3, step=9)])
    path = str(tmp_path / "shard.msgpack")
    s.save(path)
    t = ShardStore("t")
    rows = t.load(path)
    assert [r.index for r in rows] == [3, 4] and t.meta(3).step == 9
    inline, _, _ = t.get([4], ["a"])
    assert to_numpy(inline["a"][0]).shape == (2, 2) and t.num_bytes == s.num_bytes


@pytest.mark.skipif(not shm.available(), reason="needs /dev/shm")
def test_arenas_left_by_a_dead_shard_are_reaped_and_live_ones_kept():
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = shm.Arena(f"{shm.PREFIX}test-shard-{dead.pid}-0", 4096)
    mine = shm.Arena(f"{shm.PREFIX}test-shard-{os.getpid()}-0", 4096)
    try:
        assert orphan.name in shm.reap_orphans()
        assert not os.path.exists(shm.path_of(orphan.name)) and os.path.exists(shm.path_of(mine.name))
    finally:
        orphan.unlink()
        mine.unlink()
