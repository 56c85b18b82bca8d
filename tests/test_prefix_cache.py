"""The prefix cache (server/scheduling/prefix_cache.py): blocks keyed by a hash chain, a hit
kept in place or copied from a running sequence's slot of the same memory, the victim a free
slot holding nothing or used longest ago, never a running sequence's, the cap, and the flags
refused; through the real server, hits counted in GetStats and /metrics and the same tokens
as without the cache (per architecture: tests/test_checkpoints.py)."""

import re
import threading
import urllib.request

import pytest

from analysis.diagnosis import diagnose
from analysis.readers.rundir import load_run, read_samples
from analysis.readers.samples import server_series
from analysis.readers.server_stats import server_view
from analysis.readers.timeseries import client_series
from analysis.report.server import prefix_over_time, server_text
from proto import moe_pb2
from records.declare import SettingsError, build
from records.server_settings import ServerSettings
from server.engine.slots import RankSlots, SlotPool
from server.scheduling.prefix_cache import PrefixCache, block_keys
from server.settings import prepare
from tests.conftest import running_server
from tests.test_diagnosis import finding
from tests.test_end_to_end import locust


def test_keys_chain_so_equal_keys_mean_equal_prefixes():
    a, b = block_keys([1, 2, 3, 4, 5, 6, 7], 2), block_keys([1, 2, 3, 4, 9, 9], 2)
    assert len(a) == 3 and len(b) == 3  # full blocks only
    assert a[:2] == b[:2] and a[2] != b[2]
    assert block_keys([9, 9, 3, 4], 2)[1] != a[1]  # the same block after another prefix


def cache_of(slots: int = 4, cap: int | None = None) -> PrefixCache:
    return PrefixCache(2, SlotPool(range(slots)), cap)


def test_a_free_slot_holding_the_prefix_is_taken_in_place():
    cache = cache_of()
    keys = block_keys([1, 2, 3, 4, 5, 6], 2)
    first, _ = cache.place(keys, 6)
    assert first.cached == 0 and first.source is None
    cache.computed(first.slot, keys)
    cache.slots.give(first.slot)
    again, evicted = cache.place(keys, 6)
    # at most the prompt but one token: 2 blocks of 3
    assert (again.slot, again.cached, again.source, evicted) == (first.slot, 4, first.slot, 1)
    assert cache.blocks == 2


def test_a_running_sequences_prefix_is_copied_into_a_free_slot():
    cache = cache_of()
    keys = block_keys([1, 2, 3, 4, 5, 6], 2)
    running, _ = cache.place(keys, 6)
    cache.computed(running.slot, keys)  # prefilled, still decoding
    copy, _ = cache.place(block_keys([1, 2, 3, 4, 7, 7], 2), 6)
    assert copy.slot != running.slot and copy.source == running.slot and copy.cached == 4
    assert running.slot not in cache.slots  # never handed out while it runs


def test_the_victim_holds_nothing_else_was_used_longest_ago():
    cache = cache_of(slots=3)
    made = []
    for n in range(3):
        keys = block_keys([n] * 4, 2)
        placed, _ = cache.place(keys, 4)
        cache.computed(placed.slot, keys)
        made.append(placed.slot)
    for slot in made:
        cache.slots.give(slot)
    cache.place(block_keys([1] * 4, 2), 4)  # uses slot made[1]
    other, evicted = cache.place(block_keys([7] * 4, 2), 4)
    assert other.slot == made[0] and evicted == 2  # the least recently used
    assert cache.blocks == 2 + 1  # made[1]'s (kept in place: 1) and made[2]'s


def test_the_cap_forgets_the_least_recently_used_free_slots():
    cache = cache_of(cap=4)  # 2 blocks of 2
    for n in range(3):
        keys = block_keys([n] * 4, 2)
        placed, _ = cache.place(keys, 5)
        cache.computed(placed.slot, keys)
        cache.slots.give(placed.slot)
        cache.freed()
    assert cache.blocks == 2  # the last slot's two blocks: the older ones forgotten


def test_with_ranks_a_copy_stays_on_the_rank_holding_the_prefix():
    cache = PrefixCache(2, RankSlots(6, 2))
    keys = block_keys([1, 2, 3, 4, 5], 2)
    running, _ = cache.place(keys, 5)
    cache.computed(running.slot, keys)
    copy, _ = cache.place(keys, 5)
    assert copy.slot % 2 == running.slot % 2 and copy.source == running.slot


@pytest.mark.parametrize("flags, message", [
    ({"prefix_block_tokens": 0}, "--prefix-block-tokens: must be at least 1"),
    ({"prefix_block_tokens": 100_000}, "--prefix-block-tokens: must be at most the context"),
    ({"prefix_cache_tokens": 10**9, "kv_slots": 2}, "--prefix-cache-tokens: must be at most "
     "the KV pool, --kv-slots 2"),
])
def test_bad_prefix_cache_flags_are_refused_naming_the_flag(flags, message):
    with pytest.raises(SettingsError, match=message):
        prepare(build(ServerSettings, {"preset": "tiny", "device": "cpu", **flags}), ports=False)


def generate(stub, prompt: list[int], out: dict, key) -> None:
    out[key] = [t for m in stub.Generate(moe_pb2.GenerateRequest(
        prompt_token_ids=prompt, max_tokens=8, ignore_eos=True)) for t in m.token_ids]


def test_hits_are_counted_and_give_the_tokens_the_server_gives_without_the_cache():
    shared = list(range(40, 104))  # 4 blocks
    prompts = [shared + [7, 8, 9], shared + [10, 11], shared + [7, 8, 9, 12]]
    outputs = {}
    for cache in (False, True):
        got: dict = {}
        with running_server(prefix_cache=cache, max_batch_size=2, metrics_port=0) as served:
            for i in (0, 1):  # one by one, then two at once
                generate(served.stub, prompts[i], got, i)
            threads = [threading.Thread(target=generate, args=(served.stub, prompts[i], got, k))
                       for k, i in ((2, 0), (3, 2))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
            url = f"http://127.0.0.1:{served.app.metrics_port}/metrics"
            scrape = urllib.request.urlopen(url, timeout=5).read().decode()
        outputs[cache] = [got[k] for k in range(4)]
        assert stats.prefix_cache_queries == sum(map(len, prompts)) + len(prompts[0])
        if cache:
            assert stats.prefix_cache_hits >= 3 * len(shared)
            assert stats.prefix_cache_blocks > 0
            assert f"moe_prefix_cache_hits_total {float(stats.prefix_cache_hits)}" in scrape
        else:
            assert stats.prefix_cache_hits == stats.prefix_cache_blocks == 0
    assert outputs[True] == outputs[False]


@pytest.mark.slow
def test_a_run_reads_the_hit_rate_against_what_the_workload_shared(tmp_path):
    """Over GetStats alone (the moe target), the report gives the server's hit rate and the
    diagnosis judges it against the workload's prefix_share: not fired with the cache, fired
    without it."""
    verdicts = {}
    for cache in (True, False):
        run_dir = tmp_path / f"cache-{cache}"
        with running_server(prefix_cache=cache, max_batch_size=4) as served:
            done = locust(served.port, run_dir, "-t", "3s", "--rate", "4", "--arrival",
                          "constant", "--shared-prefix-tokens", "64", "--prompt-tokens", "8",
                          "--max-tokens", "4")
        assert done.returncode == 0, done.stdout
        run = load_run(run_dir)
        verdicts[cache] = finding(diagnose(run), "prefix_misses")
        text = " ".join(server_text(server_view(run.summary.server)))
        rate = re.search(r"prefix-cache hit rate \(prompt tokens\) (\d+\.\d)%", text)
        assert (float(rate[1]) > 50) is cache
        over_time = prefix_over_time(server_series(read_samples(run_dir)), client_series(run))
        asked = [row for row in over_time if row[1] != "0"]  # the run's short last sample may not
        assert len(asked) >= 2 and all(row[2].endswith("%") for row in asked)
    assert verdicts[True].judged and not verdicts[True].fired
    assert verdicts[False].fired and "workload shared" in verdicts[False].verdict


@pytest.mark.slow
def test_two_ranks_reuse_prefixes_on_the_rank_holding_them_and_generate_what_one_does():
    shared = list(range(40, 104))
    prompts = [shared + [7], shared + [8, 9], shared + [7, 10], shared + [11, 12, 13]]
    outputs = {}
    for name, flags in (("one rank, no cache", {"prefix_cache": False}), ("two ranks", {"ep": 2})):
        got: dict = {}
        with running_server(max_batch_size=2, kv_slots=4, **flags) as served:
            generate(served.stub, prompts[0], got, 0)
            threads = [threading.Thread(target=generate, args=(served.stub, prompts[i], got, i))
                       for i in (1, 2, 3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
        outputs[name] = [got[i] for i in range(4)]
        if "ep" in flags:
            assert stats.prefix_cache_hits >= len(shared)
    assert outputs["two ranks"] == outputs["one rank, no cache"]
