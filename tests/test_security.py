"""TLS, mutual TLS and bearer tokens on a real server, and the load generator reaching it with
each; plaintext beyond this machine refused without --insecure. Certificates are made here: a
CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""

import datetime
import ipaddress
import json
import subprocess
import sys

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proto import moe_pb2, moe_pb2_grpc
from records.declare import SettingsError, build
from records.server_settings import ServerSettings
from server.frontends.security import Tokens, check_exposure, guard_of
from tests.conftest import REPO, running_server
from tests.test_end_to_end import locust

Req = moe_pb2.GenerateRequest
USER, ADMIN = "user-token-1", "admin-token-2"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca=False, ip=None):
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path, cert=None, key=None) -> str:
    data = (cert.public_bytes(serialization.Encoding.PEM) if cert else
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """{name: path}: ca, server_cert, server_key, client_cert, client_key, tokens."""
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, "test CA", ca_key, ca=True)
    out = {"ca": _write(d / "ca.pem", cert=ca)}
    for who, ip in (("server", "127.0.0.1"), ("client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        out[f"{who}_cert"] = _write(d / f"{who}.pem", cert=_certificate(who, key, "test CA",
                                                                      ca_key, ip=ip))
        out[f"{who}_key"] = _write(d / f"{who}.key", key=key)
    (d / "tokens").write_text(f"# who may call\n{USER}\n\n{ADMIN} admin\n")
    out["tokens"] = str(d / "tokens")
    return out


def secure_stub(port: int, pki, client_cert=True):
    creds = grpc.ssl_channel_credentials(
        root_certificates=open(pki["ca"], "rb").read(),
        private_key=open(pki["client_key"], "rb").read() if client_cert else None,
        certificate_chain=open(pki["client_cert"], "rb").read() if client_cert else None)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
    return channel, moe_pb2_grpc.MoEInferenceStub(channel)


def bearer(token: str):
    return (("authorization", f"Bearer {token}"),)


def test_tokens_decide_who_may_generate_and_who_may_reset_the_stats(pki):
    with running_server(auth_token_file=pki["tokens"]) as s:
        with pytest.raises(grpc.RpcError) as err:
            list(s.stub.Generate(Req(prompt="hi", max_tokens=2), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "--auth-token-file" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5, metadata=bearer("wrong"))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert list(s.stub.Generate(Req(prompt="hi", max_tokens=2, ignore_eos=True),
                                    timeout=10, metadata=bearer(USER)))
        with pytest.raises(grpc.RpcError) as err:
            s.stub.ResetStats(moe_pb2.ResetStatsRequest(), timeout=5, metadata=bearer(USER))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5,
                               metadata=bearer(USER)).requests_finished == 1
        s.stub.ResetStats(moe_pb2.ResetStatsRequest(), timeout=5, metadata=bearer(ADMIN))
        assert s.stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5,
                               metadata=bearer(ADMIN)).requests_finished == 0


def test_mutual_tls_serves_a_signed_client_and_refuses_one_without_a_certificate(pki):
    with running_server(tls_cert=pki["server_cert"], tls_key=pki["server_key"],
                        tls_client_ca=pki["ca"]) as s:
        channel, stub = secure_stub(s.port, pki)
        with channel:
            assert list(stub.Generate(Req(prompt="hi", max_tokens=2, ignore_eos=True),
                                      timeout=10))
        channel, stub = secure_stub(s.port, pki, client_cert=False)
        with channel, pytest.raises(grpc.RpcError) as err:
            stub.GetStats(moe_pb2.GetStatsRequest(), timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed
        with grpc.insecure_channel(f"127.0.0.1:{s.port}") as plain, \
                pytest.raises(grpc.RpcError):
            moe_pb2_grpc.MoEInferenceStub(plain).GetStats(moe_pb2.GetStatsRequest(), timeout=5)


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_the_load_generator_runs_over_mutual_tls_with_a_token(pki, tmp_path, client):
    with running_server(tls_cert=pki["server_cert"], tls_key=pki["server_key"],
                        tls_client_ca=pki["ca"], auth_token_file=pki["tokens"]) as s:
        done = locust(s.port, tmp_path / "run", "-t", "3s", "--rate", "4", "--max-tokens", "4",
                      "--tls-ca", pki["ca"], "--tls-client-cert", pki["client_cert"],
                      "--tls-client-key", pki["client_key"], "--auth-token", USER,
                      "--client", client)
        assert done.returncode == 0, done.stdout
        summary = json.loads((tmp_path / "run/summary.json").read_text())
        assert summary["requests"]["failed"] == 0 and summary["requests"]["ok"] > 0
        assert summary["server"]["end"]["requests_finished"] > 0  # GetStats over TLS too
        assert summary["config"]["auth_token"] == "<set>"  # never written down


@pytest.mark.slow
def test_a_missing_token_stops_the_load_generator_with_a_clear_status(pki, tmp_path):
    with running_server(auth_token_file=pki["tokens"]) as s:
        done = locust(s.port, tmp_path / "run", "-t", "2s", "--rate", "4", "--max-tokens", "4",
                      "--fail-fast")
        assert done.returncode != 0
        assert "UNAUTHENTICATED" in done.stdout


def test_the_http_api_takes_tls_and_tokens_too(pki):
    import http.client
    import ssl

    with running_server(tls_cert=pki["server_cert"], tls_key=pki["server_key"],
                        auth_token_file=pki["tokens"], http_port=0) as s:
        context = ssl.create_default_context(cafile=pki["ca"])

        def post(headers):
            conn = http.client.HTTPSConnection("127.0.0.1", s.app.http_port, context=context,
                                               timeout=10)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"prompt": "hi", "max_tokens": 2}), headers={"Content-Type": "application/json",
                                                             **headers})
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())

        status, body = post({})
        assert status == 401 and "--auth-token-file" in body["error"]["message"]
        status, body = post({"Authorization": f"Bearer {USER}"})
        assert status == 200 and body["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize(("overrides", "flag"), [
    ({"host": "0.0.0.0"}, "--host 0.0.0.0"),
    ({"tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, "--tls-cert"),
    ({"tls_cert": "/a.pem"}, "--tls-key"),
    ({"tls_client_ca": "/ca.pem"}, "--tls-client-ca"),
    ({"auth_token_file": "/nonexistent"}, "--auth-token-file")])
def test_bad_security_settings_name_their_flag(overrides, flag):
    with pytest.raises(SettingsError, match=flag):
        settings = build(ServerSettings, overrides)
        check_exposure(settings)
        guard_of(settings.security)


def test_insecure_allows_plaintext_beyond_this_machine():
    check_exposure(build(ServerSettings, {"host": "0.0.0.0", "insecure": True}))
    check_exposure(build(ServerSettings, {"host": "::1"}))


def test_a_malformed_token_file_names_the_line_not_the_token(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("good\nsecret-value root extra\n")
    with pytest.raises(SettingsError, match="line 2") as err:
        Tokens.load(str(path))
    assert "secret-value" not in str(err.value)


@pytest.mark.slow
def test_the_server_cli_refuses_a_public_plaintext_listen():
    done = subprocess.run([sys.executable, "-m", "server", "--preset", "tiny", "--host",
                           "0.0.0.0", "--port", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--host 0.0.0.0" in done.stderr and "--insecure" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("client", ["gevent", "aio"])
def test_the_openai_target_runs_over_https_with_a_token(pki, tmp_path, client, monkeypatch):
    monkeypatch.setenv("MOE_AUTH_TOKEN", USER)  # the token from the environment
    with running_server(tls_cert=pki["server_cert"], tls_key=pki["server_key"],
                        auth_token_file=pki["tokens"], http_port=0) as s:
        done = locust(f"https://127.0.0.1:{s.app.http_port}", tmp_path / "run", "-t", "3s",
                      "--rate", "4", "--max-tokens", "4", "--target", "openai", "--token-ids",
                      "--tls-ca", pki["ca"], "--client", client)
        assert done.returncode == 0, done.stdout
        summary = json.loads((tmp_path / "run/summary.json").read_text())
        assert summary["requests"]["failed"] == 0 and summary["requests"]["ok"] > 0
