"""The peers' side of make bench-loadgen (loadgen/bench_peers.py): what they need of our
reference server and tokenizer, and a peer that is not installed is a row saying so."""

import urllib.request

from loadgen import bench_peers
from tests.conftest import delay_server_process


def test_an_absent_peer_is_skipped_saying_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_peers, "PEERS_DIR", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    rows = bench_peers.peer_runs("http://127.0.0.1:9", 10.0, 10, 20, 0, tmp_path)
    assert set(rows) == set(bench_peers.PEERS)
    for name, row in rows.items():
        assert row == {"skipped": f"{name} is not installed (make peers installs it)"}


def test_the_written_tokenizer_loads_offline_and_counts_a_token_a_word(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(bench_peers.write_tokenizer(tmp_path / "tok")))
    ids = tokenizer.encode("tok tok w7", add_special_tokens=False)
    assert len(ids) == 3
    assert tokenizer.decode(ids) == "tok tok w7"


def test_the_openai_reference_answers_a_health_check(tmp_path):
    with delay_server_process(tmp_path, "--protocol", "openai") as (_, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as reply:
            assert reply.status == 200
