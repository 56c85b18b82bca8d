"""records/prefix_blocks.py: the bounded block cache the load generator counts prefix sharing
with."""

from records.prefix_blocks import BLOCK, PrefixBlocks


def prompt(prefix: int, tail: int, blocks: int = 1) -> list[int]:
    """A shared BLOCK-token prefix, then `blocks` blocks of a tail of its own."""
    return [prefix] * BLOCK + [1000 + tail] * (BLOCK * blocks)


def test_memory_holds_at_its_capacity_however_many_prompts_are_sent():
    blocks = PrefixBlocks(capacity=100)
    for tail in range(1000):
        blocks.add(prompt(tail, tail, blocks=3))
    assert len(blocks.held) == 100
    assert blocks.hits == 0


def test_a_prefix_in_use_outlives_the_tails_sent_after_it():
    blocks = PrefixBlocks(capacity=10)
    hits = [blocks.add(prompt(7, tail, blocks=4)) for tail in range(50)]
    # every prompt after the first hits the shared block, though 49 x 4 tails went through a
    # cache of 10 blocks
    assert hits == [0] + [BLOCK] * 49
    assert blocks.share == BLOCK * 49 / (50 * 5 * BLOCK)


def test_a_prefix_evicted_is_missed_and_the_lookup_stops_at_it():
    blocks = PrefixBlocks(capacity=10)
    first = prompt(7, 1, blocks=2)
    blocks.add(first)
    assert blocks.add(first) == 3 * BLOCK
    blocks.held.popitem(last=True)  # the most recent: the first prompt's first block
    # its tails are still held, yet a server cannot reach them past the missing block
    assert blocks.add(first) == 0
    assert blocks.add(first) == 3 * BLOCK


def test_without_eviction_a_block_matches_only_where_the_whole_prompt_before_it_did():
    blocks = PrefixBlocks()
    blocks.add([1] * BLOCK + [2] * BLOCK)
    assert blocks.add([3] * BLOCK + [2] * BLOCK) == 0  # same second block, another first
    assert blocks.add([1] * BLOCK + [4] * BLOCK) == BLOCK
