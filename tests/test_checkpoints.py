"""--model against transformers, on tiny checkpoints built here for every supported family
(experts saved one by one, or fused as transformers 5 holds them; one index with two shards):
prefill logits within 1e-4 of transformers' forward in fp32, 32 greedy tokens identical to its
generate() through a real gRPC server while batched with other requests, the checkpoint's
tokenizer for text prompts and streamed text (a character split across tokens is held back
until whole), the dtype defaults, and each kind of bad checkpoint refused in one line naming
the file or tensor."""

import json
import subprocess
import sys
import threading

import pytest
import torch

import server.__main__
import server.settings
from proto import moe_pb2
from records.declare import SettingsError, build
from records.server_settings import ServerSettings
from server.build import build_engine
from server.engine.checkpoint import CheckpointError, open_checkpoint
from server.engine.layouts import StepLayout
from server.engine.local import LocalEngine
from server.engine.moe import StepContext
from server.settings import prepare, resolve
from tests.checkpoints import ARCHITECTURES, shard, write_checkpoint
from tests.conftest import REPO, running_server

PROMPTS = ["the experts route every token, héllo wörld", "mixture of experts",
           "naïve café: serve many requests at once, the best of their kind"]
GREEDY = 32


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (directory, transformers model) per family, experts saved one by one (Mixtral's
    under block_sparse_moe), and mixtral's fused too."""
    root = tmp_path_factory.mktemp("checkpoints")
    made = {}
    for name in ARCHITECTURES:
        directory = root / name
        made[name] = (directory, write_checkpoint(directory, name))
    made["mixtral fused"] = (root / "fused", write_checkpoint(root / "fused", "mixtral",
                                                             fused=True))
    shard(root / "qwen2_moe")
    return made


def prefill_logits(engine: LocalEngine, ids: list[int]) -> torch.Tensor:
    layout = StepLayout.build([(0, 0, len(ids))], engine.device)
    engine.timer.begin()
    logits = engine.model(torch.tensor(ids), layout, engine.kv,
                          StepContext(layout.groups, 1, engine.timer))[0]
    engine.timer.end()
    return logits


def greedy(model, ids: list[int]) -> list[int]:
    model.generation_config.eos_token_id = None  # exactly GREEDY tokens, as ignore_eos asks
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", [*ARCHITECTURES, "mixtral fused"])
def test_prefill_logits_match_transformers(checkpoints, name):
    directory, model = checkpoints[name]
    engine = LocalEngine.from_checkpoint(open_checkpoint(str(directory)), kv_slots=2, device="cpu",
                    dtype=torch.float32, seed=0)
    for prompt in PROMPTS:
        ids = engine.tokenizer.encode(prompt)
        assert ids[0] == 1  # the tokenizer's template adds BOS
        with torch.no_grad():
            expected = model(torch.tensor([ids])).logits[0, -1]
        torch.testing.assert_close(prefill_logits(engine, ids), expected, rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_greedy_tokens_equal_transformers_generate_while_batched(checkpoints, name):
    directory, model = checkpoints[name]
    # static batching: the three requests prefill and decode in the same steps
    with running_server(checkpoint=str(directory), policy="static", max_batch_size=3,
                        max_wait_ms=3000) as served:
        results: dict[int, list] = {}

        def ask(i: int) -> None:
            results[i] = list(served.stub.Generate(moe_pb2.GenerateRequest(
                prompt=PROMPTS[i], max_tokens=GREEDY, ignore_eos=True)))

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
        tokenizer = served.app.service.admission.tokenizer
    assert stats.batch_size.max == len(PROMPTS)
    generated = []
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt)
        tokens = [t for m in results[i] for t in m.token_ids]
        assert tokens == greedy(model, ids), (name, prompt)
        text = "".join(m.text for m in results[i])
        assert text == tokenizer._tokenizer.decode(tokens, skip_special_tokens=True)
        generated += tokens
    assert len(set(generated)) > 5  # real sequences, not one token repeated


SHARED = "the experts route every token, and the batch waits for the slowest"


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_prefix_cache_hits_give_the_tokens_a_whole_prefill_gives(checkpoints, name):
    """One by one (a hit kept in place, a next turn hitting the reply too), then two at once
    hitting one slot (one keeps it, the other copies it while it runs): every output is
    transformers' greedy one for the whole prompt."""
    directory, model = checkpoints[name]
    with running_server(checkpoint=str(directory), policy="static", max_batch_size=2,
                        kv_slots=4, max_wait_ms=200, prefix_block_tokens=4) as served:
        tokenizer = served.app.service.admission.tokenizer
        asked: list[tuple[list[int], list[int]]] = []

        def ask(ids: list[int]) -> list[int]:
            out = [t for m in served.stub.Generate(moe_pb2.GenerateRequest(
                prompt_token_ids=ids, max_tokens=12, ignore_eos=True)) for t in m.token_ids]
            asked.append((ids, out))
            return out

        first = tokenizer.encode(SHARED + " one")
        ask(tokenizer.encode(SHARED + " two words"))
        reply = ask(first)
        turn = first + reply + tokenizer.encode(" and then")
        turn = turn + ask(turn)
        threads = [threading.Thread(target=ask, args=(turn + tokenizer.encode(end),))
                   for end in (" x", " y z")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        stats = served.stub.GetStats(moe_pb2.GetStatsRequest())
    assert len(asked) == 5 and stats.prefix_cache_hits > len(turn) and stats.prefix_cache_copied
    for i, (ids, out) in enumerate(asked):
        assert out == greedy(model, ids)[:12], (name, i, len(ids))


def test_streamed_text_holds_back_a_character_split_across_tokens(checkpoints):
    directory, _ = checkpoints["olmoe"]
    tokenizer = open_checkpoint(str(directory)).tokenizer()
    ids = tokenizer.encode("ok 🙂 ü")[1:]  # the emoji's 4 bytes are 4 byte tokens
    decoder = tokenizer.decoder()
    chunks = [decoder.decode([i]) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == "ok 🙂 ü" and not any("\ufffd" in c for c in chunks)
    assert "" in chunks  # a byte of the emoji alone yields nothing yet


def settings(**values) -> ServerSettings:
    return build(ServerSettings, {"port": 0} | values)


def test_dtype_is_the_checkpoint_s_on_cuda_and_float32_on_cpu(tmp_path):
    write_checkpoint(tmp_path, "qwen3_moe", dtype=torch.bfloat16)
    checkpoint = open_checkpoint(str(tmp_path))

    def resolved(**values) -> ServerSettings:
        return resolve(settings(checkpoint=str(tmp_path), **values), checkpoint.args, checkpoint)

    on_cpu, on_cuda = resolved(device="cpu"), resolved(device="cuda")
    asked = resolved(device="cpu", dtype="bfloat16")
    assert (on_cpu.model.dtype, on_cuda.model.dtype, asked.model.dtype) == (
        "float32", "bfloat16", "bfloat16")
    assert on_cpu.model.preset == "" and on_cpu.moe.renormalize is True  # norm_topk_prob
    engine = LocalEngine.from_checkpoint(open_checkpoint(str(tmp_path)), 1, "cpu", torch.bfloat16,
                                         0)
    assert engine.model.layers[0].moe.experts.w13.dtype == torch.bfloat16


def damage(directory, how: str) -> None:
    config = json.loads((directory / "config.json").read_text())
    if how == "no config":
        (directory / "config.json").unlink()
    elif how == "deepseek":
        config["architectures"] = ["DeepseekV3ForCausalLM"]
    elif how == "unknown":
        config["architectures"] = ["LlamaForCausalLM"]
    elif how == "dtype":
        config["dtype"] = "int8"
    elif how == "no tokenizer":
        (directory / "tokenizer.json").unlink()
    elif how == "fewer experts":
        config["num_experts"] = 6
    elif how == "more experts":
        config["num_experts"] = 10
    elif how == "wider":
        config["moe_intermediate_size"] = 40
    if how not in ("no config", "no tokenizer"):
        (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("how, message", [
    ("no config", "config.json is missing"),
    ("deepseek", r"DeepseekV3ForCausalLM \(.*config.json\): its multi-head latent attention"),
    ("unknown", "architecture 'LlamaForCausalLM' .* is not supported; supported: Mixtral"),
    ("dtype", "dtype 'int8'; expected one of float32"),
    ("no tokenizer", "tokenizer.json is missing"),
])
def test_a_bad_config_is_refused_before_anything_is_built(tmp_path, how, message):
    write_checkpoint(tmp_path, "qwen3_moe")
    damage(tmp_path, how)
    with pytest.raises(SettingsError, match=f"^--model: .*{message}"):
        prepare(settings(checkpoint=str(tmp_path)))


@pytest.mark.parametrize("how, message", [
    ("more experts", r"tensor model.layers.0.mlp.experts.8.down_proj.weight is missing from "
                     r".* \(and 11 more\); does config.json match the weights\?"),
    ("fewer experts", r"unexpected tensor model.layers.0.mlp.experts.6.down_proj.weight in "
                      r"model.safetensors; config.json says Qwen3MoeForCausalLM with 2 layers "
                      r"and 6 experts"),
    ("wider", r"tensor model.layers.0.mlp.experts.0.gate_proj.weight in model.safetensors has "
              r"shape \[32, 64\]; config.json asks for \[40, 64\]"),
    ("missing shard", "model-00002-of-00002.safetensors is missing"),
])
def test_weights_that_do_not_match_are_refused_naming_the_tensor(tmp_path, how, message):
    write_checkpoint(tmp_path, "qwen3_moe")
    if how == "missing shard":
        shard(tmp_path)
        (tmp_path / "model-00002-of-00002.safetensors").unlink()
    else:
        damage(tmp_path, how)
    with pytest.raises(CheckpointError, match=f"^--model: .*{message}"):
        LocalEngine.from_checkpoint(open_checkpoint(str(tmp_path)), 1, "cpu", torch.float32, 0)


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_checkpoint_in_one_line(tmp_path):
    write_checkpoint(tmp_path, "olmoe")
    damage(tmp_path, "unknown")
    done = subprocess.run([sys.executable, "-m", "server", "--model", str(tmp_path), "--port",
                           "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        "python -m server: error: --model: architecture 'LlamaForCausalLM'")


def test_a_checkpoint_is_opened_once_from_the_command_line_to_the_engine(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, "qwen3_moe")
    opened = []

    def counted(*args, **kwargs):
        opened.append(args)
        return open_checkpoint(*args, **kwargs)

    monkeypatch.setattr(server.settings, "open_checkpoint", counted)
    startup = server.__main__.parse_args(["--model", str(tmp_path), "--device", "cpu",
                                          "--port", "0", "--kv-slots", "2"])
    engine = build_engine(startup)
    try:
        assert len(opened) == 1 and engine.args == startup.args == startup.checkpoint.args
    finally:
        engine.stop()
