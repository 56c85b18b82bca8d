"""The GetStats reply (proto/moe.proto EngineStats): every declared metric's reading
(records/engine_telemetry.py, server/telemetry/readings.py) placed in the message the
declaration names, one LayerStats per MoE layer, one RankPair per ordered pair of ranks; and
beside them the settings the server runs with and the model's shape."""

from __future__ import annotations

from proto import moe_pb2
from records import engine_telemetry as declared
from records.declare import flat, text
from records.server_settings import ServerSettings
from server.engine.model_args import ModelArgs


def histogram_message(h) -> moe_pb2.Histogram:
    return moe_pb2.Histogram(bounds=h.bounds, counts=h.counts, count=h.count, sum=h.sum, max=h.max)


def fields_at(message: str, values: dict, index: tuple = ()) -> dict:
    """The message's fields from the readings: each metric's value at index (a layer, a stage,
    a pair of ranks); a metric without a reading keeps the field's default, or its declared
    value when absent (-1: unknown GPU utilisation)."""
    out = {}
    for m in declared.metrics_of(message):
        value = values[m.name]
        for i in index:
            value = None if value is None else value[i]
        if value is not None:
            out[m.name] = histogram_message(value) if m.kind == declared.HISTOGRAM else value
        elif m.absent:
            out[m.name] = m.absent
    return out


def settings_fields(settings: ServerSettings) -> dict:
    """GetStats' `settings` map, and the older EngineStats fields that carry a setting of the
    same name (an unset one keeps the field's default)."""
    values = flat(settings)
    names = moe_pb2.EngineStats.DESCRIPTOR.fields_by_name
    older = {name: value for name, value in values.items() if name in names and value is not None}
    return older | {"settings": {name: text(value) for name, value in values.items()}}


def stats_message(values: dict, args: ModelArgs, settings: dict,
                  knobs: dict[str, float]) -> moe_pb2.EngineStats:
    """values: the window's readings; settings: settings_fields() of the server's settings;
    knobs: the batching policy's."""
    layers = []
    for i in range(args.n_layers):
        layer = moe_pb2.LayerStats(**fields_at(declared.LAYER, values, (i,)))
        if values["hits"] is not None:  # with an expert cache
            layer.cache.CopyFrom(moe_pb2.CacheStats(**fields_at(declared.CACHE, values, (i,))))
        layers.append(layer)
    return moe_pb2.EngineStats(
        **settings, **fields_at(declared.ENGINE, values), policy_knobs=knobs,
        num_layers=args.n_layers, num_experts=args.n_experts, top_k=args.top_k,
        hidden_size=args.dim, max_seq_len=args.max_seq_len,
        layers=layers,
        expert_tokens=[moe_pb2.LayerExpertTokens(tokens=row) for row in values["expert_tokens"]],
        stages=[moe_pb2.StageTime(stage=name, **fields_at(declared.STAGE, values, (name,)))
                for name in values["ms"]],
        faults=moe_pb2.FaultCounts(**fields_at(declared.FAULTS, values)),
        expert_parallel=exchange_message(values))


def exchange_message(values: dict) -> moe_pb2.ExpertParallelStats | None:
    """The exchanges between ranks; None with one rank."""
    ranks = values["ranks"]
    if ranks is None:
        return None
    pairs = [moe_pb2.RankPair(source=s, destination=d, **fields_at(declared.PAIR, values, (s, d)))
             for s in range(ranks) for d in range(ranks) if s != d]
    return moe_pb2.ExpertParallelStats(**fields_at(declared.EXCHANGE, values), pairs=pairs)
