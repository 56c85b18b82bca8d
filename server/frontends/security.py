"""Who may call the server (docs/security.md): TLS, or mutual TLS, on both front ends; bearer
tokens checked before any work; refusing to serve plaintext beyond this machine unless told to.

A token file holds one token per line, `TOKEN admin` for one that may also call ResetStats;
blank lines and lines starting with # are skipped. A caller is named by its token's hash, never
the token itself, wherever it is written down (logs, fairness quotas).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import ssl
from dataclasses import dataclass

import grpc

from records.declare import SettingsError
from records.server_settings import Security, ServerSettings

HEALTH_PREFIX = "/grpc.health.v1.Health/"  # load balancers probe it without credentials
ADMIN_ONLY = ("ResetStats",)  # zeroes the window every client measures


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve anywhere
        return False


def check_exposure(settings: ServerSettings) -> None:
    """Plaintext beyond this machine only with --insecure."""
    host, security = settings.serving.host, settings.security
    if not is_loopback(host) and not security.tls_cert and not security.insecure:
        raise SettingsError(f"--host {host}: listening beyond this machine without TLS would "
                            "send prompts and tokens in the clear; give --tls-cert and --tls-key, "
                            "or --insecure to accept that")


def read_file(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise SettingsError(f"--{flag}: cannot read {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class Caller:
    name: str  # "token:" and the first hex digits of the token's SHA-256
    admin: bool


def caller_name(token: str) -> str:
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


class Tokens:
    def __init__(self, tokens: dict[str, bool]):
        self.tokens = tokens  # token -> admin

    @classmethod
    def load(cls, path: str) -> Tokens:
        tokens = {}
        text = read_file("auth-token-file", path).decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) > 2 or (len(words) == 2 and words[1] != "admin"):
                raise SettingsError(f"--auth-token-file: {path} line {number}: expected TOKEN or "
                                    f"'TOKEN admin', got {len(words)} words")
            tokens[words[0]] = len(words) == 2
        if not tokens:
            raise SettingsError(f"--auth-token-file: {path} holds no token")
        return cls(tokens)

    def caller(self, authorization: str) -> Caller | None:
        """The caller an `authorization` value names ("Bearer TOKEN"), or None. Every token is
        compared in constant time, so timing tells nothing of a near miss."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        found = None
        for known, admin in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                found = Caller(caller_name(known), admin)
        return found


def client_of(authorization: str, host: str, tokens: Tokens | None) -> str:
    """Who sent a request, for the per-client quota and fair admission: its token's caller
    where tokens are checked, else the address it came from (without a port)."""
    if tokens is not None and (caller := tokens.caller(authorization)):
        return caller.name
    return host


def peer_host(peer: str) -> str:
    """gRPC's peer ("ipv4:127.0.0.1:40000", "ipv6:[::1]:40000") without its port."""
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer


def metadata_value(metadata, key: str) -> str:
    return next((value for name, value in metadata or () if name == key), "")


def refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str):
    """A handler of the same kind as handler that only refuses."""
    async def refuse(_request, context):
        await context.abort(code, message)

    kinds = {"unary_unary": grpc.unary_unary_rpc_method_handler,
             "unary_stream": grpc.unary_stream_rpc_method_handler,
             "stream_unary": grpc.stream_unary_rpc_method_handler,
             "stream_stream": grpc.stream_stream_rpc_method_handler}
    kind = next(name for name in kinds if getattr(handler, name) is not None)
    return kinds[kind](refuse, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED without a listed token, PERMISSION_DENIED for an admin-only method
    without an admin one; health checks pass."""

    def __init__(self, tokens: Tokens):
        self.tokens = tokens

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_PREFIX):
            return handler
        caller = self.tokens.caller(metadata_value(details.invocation_metadata, "authorization"))
        if caller is None:
            return refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                           "a valid bearer token is required: send metadata 'authorization: "
                           "Bearer TOKEN' with a token from the server's --auth-token-file")
        if details.method.rsplit("/", 1)[-1] in ADMIN_ONLY and not caller.admin:
            return refusal(handler, grpc.StatusCode.PERMISSION_DENIED,
                           "ResetStats needs an admin token ('TOKEN admin' in the server's "
                           "--auth-token-file): it zeroes the counters every client measures")
        return handler


@dataclass(frozen=True)
class Guard:
    """What start-up read of the security settings, for both front ends."""

    grpc_credentials: grpc.ServerCredentials | None
    ssl_context: ssl.SSLContext | None
    tokens: Tokens | None

    @property
    def interceptors(self) -> tuple[grpc.aio.ServerInterceptor, ...]:
        return (AuthInterceptor(self.tokens),) if self.tokens else ()


def guard_of(security: Security) -> Guard:
    """Reads the certificates and tokens the settings name; SettingsError naming the flag."""
    tokens = Tokens.load(security.auth_token_file) if security.auth_token_file else None
    if not security.tls_cert:
        return Guard(None, None, tokens)
    cert = read_file("tls-cert", security.tls_cert)
    key = read_file("tls-key", security.tls_key)
    ca = read_file("tls-client-ca", security.tls_client_ca) if security.tls_client_ca else None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(security.tls_cert, security.tls_key)
        if security.tls_client_ca:
            context.load_verify_locations(security.tls_client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except ssl.SSLError as exc:
        raise SettingsError(f"--tls-cert/--tls-key: not a usable certificate and key "
                            f"({exc.reason or exc})") from None
    credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                              require_client_auth=ca is not None)
    return Guard(credentials, context, tokens)
