import pytest

from asyncflow.engines.kv_cache import KVBlockPool


def make_pool(budget_bytes: int) -> KVBlockPool:
    # 2 layers x 2 heads x 4 dims x fp32 x (k, v) = 128 bytes per token; 4-token blocks = 512 bytes.
    return KVBlockPool(num_layers=2, num_kv_heads=2, head_dim=4, budget_bytes=budget_bytes, block_tokens=4)


def test_pool_tensors_fit_inside_the_budget():
    pool = make_pool(budget_bytes=2000)
    assert pool.block_bytes == 512
    assert pool.num_blocks == 3
    assert pool.k.nbytes + pool.v.nbytes == pool.capacity_bytes <= 2000


def test_allocation_refuses_what_does_not_fit_and_frees_on_release():
    pool = make_pool(budget_bytes=4 * 512)
    a = pool.allocate(9)  # 3 blocks
    assert a is not None and len(a) == 3
    assert pool.allocate(5) is None  # needs 2, 1 left
    b = pool.allocate(4)
    assert b is not None and pool.used_bytes == pool.capacity_bytes
    pool.free(a)
    assert pool.used_bytes == 512
    assert pool.peak_used_bytes == pool.capacity_bytes


def test_slots_of_blocks_are_contiguous_within_each_block():
    pool = make_pool(budget_bytes=4 * 512)
    assert pool.slots([2, 0]).tolist() == [8, 9, 10, 11, 0, 1, 2, 3]


def test_a_budget_below_one_block_is_an_error_naming_the_setting():
    with pytest.raises(ValueError, match="raise kv_cache_bytes"):
        make_pool(budget_bytes=100)
