"""The native engine's prefix cache (engines/prefix_cache.py): the full KV blocks of a
finished sequence stay in the pool, and a later prompt that starts with the same tokens,
under the same weights, takes them instead of running its prefill again."""

import pytest
from test_native_rollout import assert_greedy_is_transformers, assert_training_logprobs

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine
from asyncflow.engines.kv_cache import KVBlockPool
from asyncflow.engines.prefix_cache import PrefixCache

BT = 4  # tokens per block in the pool-level tests


def make_cache(num_blocks: int) -> tuple[KVBlockPool, PrefixCache]:
    # 2 layers x 2 heads x 4 dims x fp32 x (k, v) = 128 bytes per token; 4-token blocks = 512 bytes.
    pool = KVBlockPool(num_layers=2, num_kv_heads=2, head_dim=4, budget_bytes=num_blocks * 512, block_tokens=BT)
    return pool, PrefixCache(pool)


def accounted(pool: KVBlockPool, cache: PrefixCache, held: int = 0) -> bool:
    """Every block is free, idle in the cache, or one of the ``held`` blocks sequences hold,
    and only one of these: nothing leaks, nothing is freed twice."""
    free, idle = set(pool._free), set(cache._idle)
    return len(free) == len(pool._free) and not free & idle and len(free) + len(idle) + held == pool.num_blocks


def test_a_finished_sequences_full_blocks_serve_a_later_prompt_with_the_same_tokens():
    pool, cache = make_cache(8)
    tokens = list(range(10, 21))  # 11 tokens fed: blocks 0 and 1 are full, block 2 holds 3
    blocks = pool.allocate(12)
    epoch = cache.epoch
    cache.finish(tokens, blocks, held=0, epoch=epoch)
    assert cache.idle_bytes == 2 * pool.block_bytes and pool.used_bytes == 0 and accounted(pool, cache)
    # a prompt with the first 8 tokens and more: both blocks; at least one of its tokens is left to run
    assert cache.match(tokens[:8] + [99, 98]) == blocks[:2]
    assert pool.used_bytes == 2 * pool.block_bytes and cache.idle_bytes == 0 and accounted(pool, cache, held=2)
    cache.release(blocks[:2])
    assert cache.match(tokens[:8]) == blocks[:1]  # 8 tokens: the second block would leave none to run
    cache.release(blocks[:1])
    assert cache.match(tokens[:3] + [0] * 9) == []  # differs within the first block
    assert cache.match([5] + tokens[1:]) == []
    assert cache.hits == 2 and cache.hit_tokens == 12


def test_a_block_is_reused_only_after_the_same_prefix_not_for_the_same_tokens_elsewhere():
    pool, cache = make_cache(8)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    cache.finish(a, pool.allocate(9), held=0, epoch=cache.epoch)
    assert cache.match([0, 0, 0, 0, 5, 6, 7, 8, 9]) == []  # block 1's tokens, after another block 0


def test_held_blocks_are_never_evicted_and_idle_ones_go_least_recently_used_first():
    pool, cache = make_cache(4)
    first, second = [1] * 5, [2] * 5
    b1, b2 = pool.allocate(5), pool.allocate(5)  # 2 blocks each: the pool is full
    cache.finish(first, b1, held=0, epoch=cache.epoch)  # block b1[0] idle, b1[1] freed
    cache.finish(second, b2, held=0, epoch=cache.epoch)
    assert cache.idle_bytes == 2 * pool.block_bytes
    held = cache.match(first)  # b1[0] held again, b2[0] the only idle block
    assert held == b1[:1]
    got = pool.allocate(3 * BT)  # 2 free + 1 evicted: the idle one
    assert got is not None and b2[0] in got and b1[0] not in got
    assert cache.match(second) == []  # evicted
    assert pool.allocate(1) is None  # the held block is not taken, whatever is asked
    pool.free(got)
    cache.release(held)
    assert accounted(pool, cache)


def test_an_allocation_never_fails_for_blocks_the_cache_could_give_back():
    pool, cache = make_cache(4)
    for t in range(4):
        cache.finish([t] * BT, pool.allocate(BT), held=0, epoch=cache.epoch)  # one full block each
    assert len(pool._free) == 0 and cache.idle_bytes == pool.capacity_bytes and pool.used_bytes == 0
    assert pool.allocate(4 * BT) is not None and cache.idle_bytes == 0


def test_new_weights_drop_the_cache_and_a_block_held_across_them_is_freed_when_released():
    pool, cache = make_cache(8)
    tokens = list(range(9))
    cache.finish(tokens, pool.allocate(9), held=0, epoch=cache.epoch)
    held = cache.match(tokens[:4] + [50])  # a running sequence keeps block 0
    own = pool.allocate(8)
    epoch = cache.epoch
    cache.clear()  # load_weights: KV computed under other weights is not reused
    assert cache.epoch == epoch + 1 and cache.idle_bytes == 0
    assert cache.match(tokens) == []
    # the sequence admitted before the swap finishes: nothing of it is kept, its held block is freed
    cache.finish(tokens[:4] + [50] * 6, held + own, held=len(held), epoch=epoch)
    assert pool.used_bytes == 0 and cache.idle_bytes == 0 and accounted(pool, cache)


def test_the_same_tokens_finished_twice_are_kept_once():
    pool, cache = make_cache(8)
    tokens = list(range(9))
    a, b = pool.allocate(9), pool.allocate(9)
    cache.finish(tokens, a, held=0, epoch=cache.epoch)
    cache.finish(tokens, b, held=0, epoch=cache.epoch)  # another sample of the same prompt, same tokens
    assert cache.idle_bytes == 2 * pool.block_bytes and accounted(pool, cache)
    assert cache.match(tokens) == a[:2]


def test_a_sequence_that_took_cached_blocks_keeps_its_own_continuation():
    pool, cache = make_cache(8)
    cache.finish(list(range(5)), pool.allocate(5), held=0, epoch=cache.epoch)
    held = cache.match(list(range(4)) + [7, 7, 7, 7, 7])
    rest = pool.allocate(8)
    cache.finish(list(range(4)) + [7, 7, 7, 7, 7], held + rest, held=1, epoch=cache.epoch)
    assert cache.match(list(range(4)) + [7] * 4 + [1]) == held + rest[:1]


# -- in the engine --------------------------------------------------------------------------


def engine(model_dir, **kw):
    cfg = dict(max_batch_size=8, kv_cache_bytes=1 << 20)
    cfg.update(kw)
    return build_rollout_engine(RolloutEngineConfig(**cfg), model_dir)


def second_turn(first: list[int], completion, extra: list[int]) -> list[int]:
    """The next turn's prompt as a chat does it: the conversation so far, then new tokens."""
    return first + completion.response_ids + extra


def test_a_second_turn_runs_only_what_the_first_did_not_and_its_logprobs_stay_the_trainers(qwen2_dir):
    rollout = engine(qwen2_dir)
    first = [4] + [9, 10, 11, 12] * 5  # 21 tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=14, stop_token_ids=(), seed=2)
    (turn1,) = rollout.generate([first], params)
    assert rollout.stats.prefix_cached_tokens == 0
    prompt = second_turn(first, turn1, [30, 31, 32, 5])  # 21 + 14 + 4 = 39 tokens
    out = rollout.generate([prompt], params)
    # fed in turn 1: the prompt and all but the last sampled token, 34 tokens: 2 full blocks of 16
    assert rollout.stats.prefix_cached_tokens == 32
    assert rollout.stats.prefill_tokens == len(prompt) - 32
    assert_training_logprobs(qwen2_dir, [prompt], out)
    assert_greedy_is_transformers(qwen2_dir, [prompt], rollout, max_new_tokens=6)


def test_the_samples_of_a_group_admitted_after_others_finished_take_their_prompt_from_the_cache(qwen2_dir):
    rollout = engine(qwen2_dir, max_batch_size=2)
    prompt = [4] + [9, 10, 11] * 8 + [5]  # 26 tokens: one full block
    out = rollout.generate([prompt], SamplingParams(max_new_tokens=6, n=6, stop_token_ids=(), seed=1))
    # 2 rows: the first pair runs the prompt, the later pairs find its first block
    assert rollout.stats.num_prefills == 3 and rollout.stats.prefix_cached_tokens == 2 * 16
    assert_training_logprobs(qwen2_dir, [prompt], out)


def test_new_weights_are_never_served_keys_and_values_computed_under_the_old(qwen2_dir):
    rollout = engine(qwen2_dir)
    first = [4] + [9, 10, 11, 12] * 5
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=())
    (turn1,) = rollout.generate([first], params)
    weights = [(n, p.detach() * 1.01) for n, p in rollout.model.named_parameters()]
    rollout.load_weights(weights, version=1)
    prompt = second_turn(first, turn1, [30, 5])
    out = rollout.generate([prompt], params)
    assert rollout.stats.prefix_cached_tokens == 0 and out[0].version == 1


def test_prefix_cache_off_runs_every_prompt_token(qwen2_dir):
    rollout = engine(qwen2_dir, prefix_cache=False)
    first = [4] + [9, 10, 11, 12] * 5
    params = SamplingParams(max_new_tokens=12, stop_token_ids=(), seed=0)
    (turn1,) = rollout.generate([first], params)
    prompt = second_turn(first, turn1, [30, 5])
    rollout.generate([prompt], params)
    assert rollout.stats.prefix_cached_tokens == 0 and rollout.stats.prefill_tokens == len(prompt)
    assert rollout.pool.used_bytes == 0 and rollout.prefix is None


def test_a_small_cache_evicts_what_it_keeps_and_every_prompt_still_runs(qwen2_dir):
    # 5 blocks of 16 tokens; each sequence reserves 2: cached blocks must give way to admissions
    rollout = engine(qwen2_dir, max_batch_size=4, kv_cache_bytes=5 * 8192 + 100)
    prompts = [[4] + [t] * 18 + [5] for t in range(20, 28)]
    out = rollout.generate(prompts, SamplingParams(max_new_tokens=8, n=2, stop_token_ids=(), seed=3))
    assert len(out) == 16 and rollout.stats.max_running == 2
    assert rollout.pool.used_bytes == 0 and rollout.stats.peak_kv_used_bytes <= rollout.kv_capacity_bytes


def test_an_error_mid_generation_releases_cached_blocks_it_held(qwen2_dir):
    rollout = engine(qwen2_dir, max_batch_size=4)
    first = [4] + [9, 10, 11, 12] * 5
    params = SamplingParams(max_new_tokens=12, stop_token_ids=(), seed=0)
    (turn1,) = rollout.generate([first], params)
    real_decode = rollout._decode

    def failing_decode(*args):
        raise RuntimeError("device lost")

    rollout._decode = failing_decode
    with pytest.raises(RuntimeError, match="device lost"):
        rollout.generate([second_turn(first, turn1, [30, 5])], params)
    assert rollout.pool.used_bytes == 0 and accounted(rollout.pool, rollout.prefix)
    rollout._decode = real_decode
    rollout.generate([second_turn(first, turn1, [30, 5])], params)
    assert rollout.stats.prefix_cached_tokens == 32  # the blocks went back to the cache, not lost


def test_a_sequence_that_spans_a_weight_swap_in_a_stream_is_not_kept(qwen2_dir):
    rollout = engine(qwen2_dir)
    first = [4] + [9, 10, 11, 12] * 5
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=())
    stream = rollout.open_stream(params)
    try:
        stream.add([first])
        done = stream.step()  # prefill and one decode, under version 0
        weights = [(n, p.detach().clone()) for n, p in rollout.model.named_parameters()]
        rollout.load_weights(weights, version=1)
        while stream.num_active:
            done += stream.step()
    finally:
        stream.close()
    assert rollout.prefix is not None and rollout.prefix.idle_bytes == 0
    rollout.generate([second_turn(first, done[0], [30, 5])], params)
    assert rollout.stats.prefix_cached_tokens == 0
