"""Workload shapes: request classes by weight, ShareGPT-style datasets, rate profiles
(sinusoid, bursts, trace replay), with bad specs refused naming what is wrong."""

import itertools
import json

import pytest

from loadgen.traffic.profiles import Profile
from loadgen.traffic.workload import Workload, load_dataset, parse_classes
from records.declare import build
from records.load_settings import LoadSettings


def config(**overrides) -> LoadSettings:
    base = {"seed": 0, "mode": "mixed", "classes": "chat:3:8:4,long:1:64:2", "dataset": "",
            "prompt_tokens": 4, "prompt_tokens_max": 0, "max_tokens": 16}
    return build(LoadSettings, base | overrides)


def test_classes_are_drawn_by_weight_with_their_shapes():
    workload = Workload(config())
    drawn = [workload.request(i) for i in range(4000)]
    names = [spec.request_class for spec in drawn]
    assert names.count("chat") / len(names) == pytest.approx(0.75, abs=0.03)
    for spec in drawn[:50]:
        shape = (8, 4) if spec.request_class == "chat" else (64, 2)
        assert (len(spec.prompt_ids), spec.max_tokens) == shape
    assert [spec.request_id for spec in drawn[:3]] == ["0-0", "0-1", "0-2"]
    # any process builds the same request
    assert workload.request(7) == Workload(config()).request(7)


@pytest.mark.parametrize("spec, error", [("chat:3:8", "name:weight"),
                                         ("a:0:8:4", "weight above 0"),
                                         ("a:1:x:4", "must be numbers"),
                                         ("a:1:8:4,a:2:8:4", "repeat")])
def test_bad_classes_are_refused(spec, error):
    with pytest.raises(ValueError, match=error):
        parse_classes(spec)


def test_dataset_gives_prompts_and_capped_output_lengths(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "hi"},
                           {"from": "gpt", "value": "hello there"}]},
        {"conversations": [{"from": "gpt", "value": "no question first"}]},
        {"conversations": [{"from": "human", "value": "tell me a story"},
                           {"from": "gpt", "value": "x" * 500}]},
    ]))
    assert load_dataset(str(path)) == [("hi", "hello there"), ("tell me a story", "x" * 500)]
    workload = Workload(config(mode="fixed", dataset=str(path), max_tokens=100))
    for spec in (workload.request(i) for i in range(20)):
        assert spec.request_class == "dataset"
        assert (spec.prompt_text, spec.max_tokens) in {("hi", 11), ("tell me a story", 100)}
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="no conversation"):
        load_dataset(str(tmp_path / "empty.json"))


def window_counts(profile: Profile, rate: float, windows: list[tuple[float, float]],
                  horizon_s: float = 200):
    arrivals = profile.arrivals(rate, seed=1)
    times = [t for _, t in itertools.takewhile(lambda a: a[1] < horizon_s, arrivals)]
    return [sum(1 for t in times if a <= t % 20 < b) for a, b in windows]


def test_sinusoid_profile_peaks_and_troughs():
    # period 20 s, amplitude 0.8: the first quarter averages well above the third.
    peak, trough = window_counts(Profile.parse("sinusoid:20:0.8"), 10.0, [(2.5, 7.5), (12.5, 17.5)])
    assert peak > 3 * trough


def test_bursts_profile_multiplies_the_rate_in_bursts():
    burst, calm = window_counts(Profile.parse("bursts:20:5:4"), 5.0, [(0, 5), (10, 15)])
    assert burst / calm == pytest.approx(4, rel=0.25)


def test_trace_profile_replays_times_split_over_workers(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("time_s\n10.5\n10.0\n12.0\n11.0\n")
    profile = Profile.parse(f"trace:{trace}")
    assert list(profile.arrivals(1.0, seed=0)) == [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0)]
    assert list(profile.arrivals(1.0, seed=0, workers=2, index=1)) == [(1, 0.5), (3, 2.0)]


@pytest.mark.parametrize("spec", ["sinusoid:10", "sinusoid:10:2", "bursts:5:10:2", "wave:1:2",
                                  "trace:"])
def test_bad_profiles_are_refused(spec):
    with pytest.raises(ValueError):
        Profile.parse(spec)


def test_a_shared_prefix_starts_every_prompt_one_of_the_groups_then_its_own_tokens(tmp_path):
    from records.prefix_blocks import PrefixBlocks

    settings = build(LoadSettings, {"shared_prefix_tokens": 64, "prefix_groups": 3,
                                    "prompt_tokens": 20, "seed": 4})
    workload = Workload(settings)
    specs = [workload.request(i) for i in range(60)]
    assert {len(s.prompt_ids) for s in specs} == {64 + 20}
    prefixes = {s.prompt_ids[:64] for s in specs}
    assert prefixes == {workload.shared_prefix(g) for g in range(3)}
    assert len({s.prompt_ids[64:] for s in specs}) == 60  # each its own tokens after it
    # the share a cache could hit: every request after its group's first, the prefix's 4 blocks
    blocks = PrefixBlocks()
    for s in specs:
        blocks.add(s.prompt_units)
    assert blocks.share == pytest.approx((60 - 3) * 64 / (60 * 84))
    # a dataset's text prompts get it as text
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hello there"},
                                                   {"from": "gpt", "value": "hi"}]}]))
    text = Workload(build(LoadSettings, {"shared_prefix_tokens": 8, "dataset": str(data)}))
    spec = text.request(0)
    assert spec.prompt_text.endswith("hello there") and len(spec.prompt_text) == 8 + 11


def test_the_workload_offered_is_tallied_exactly_and_survives_the_aio_senders_hand_over():
    from loadgen.traffic.offered import Offered

    workload = Workload(build(LoadSettings, {"prompt_tokens": 10, "prompt_tokens_max": 19,
                                             "max_tokens": 7, "shared_prefix_tokens": 16}))
    offered = Offered()
    specs = [workload.request(i) for i in range(200)]
    for spec in specs:
        offered.add(spec)
    figures = offered.figures()
    prompts = sorted(len(s.prompt_ids) for s in specs)
    assert figures.requests == 200 and figures.prompt_tokens.max == prompts[-1] <= 16 + 19
    assert figures.prompt_tokens.p50 == prompts[99] and figures.prompt_tokens.p99 == prompts[197]
    assert figures.prompt_tokens.mean == pytest.approx(sum(prompts) / 200)
    assert (figures.max_tokens.p50, figures.max_tokens.max) == (7, 7)
    assert figures.prefix_share == pytest.approx(199 * 16 / sum(prompts))
    handed = Offered.of_state(json.loads(json.dumps(offered.state())))
    assert handed.figures() == figures
    assert Offered().figures() is None
