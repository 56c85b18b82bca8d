"""How the load generator proves itself to a server, for every target (docs/security.md): TLS
with a CA of the user's (or the system's), a client certificate for mutual TLS, and a bearer
token ($MOE_AUTH_TOKEN when --auth-token is not given).

Files are read once, when the target is built; one that cannot be read is a ValueError naming
its flag, which the run reports before sending anything.
"""

from __future__ import annotations

import os
import ssl

import grpc

from records.load_settings import TargetSettings

TOKEN_ENV = "MOE_AUTH_TOKEN"


def _read(flag: str, path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"--{flag}: cannot read {path}: {exc.strerror}") from None


class Credentials:
    def __init__(self, settings: TargetSettings):
        self.settings = settings
        self.token = settings.auth_token or os.environ.get(TOKEN_ENV, "")
        self.tls = settings.tls or bool(settings.tls_ca or settings.tls_cert)
        self.ca = _read("tls-ca", settings.tls_ca)
        self.cert = _read("tls-client-cert", settings.tls_cert)
        self.key = _read("tls-client-key", settings.tls_key)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata sent with every call."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    @property
    def header(self) -> dict[str, str]:
        """The HTTP header sent with every request."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def channel(self, host: str, options=(), aio: bool = False):
        """A gRPC channel to host, over TLS where the settings ask for it."""
        kind = grpc.aio if aio else grpc
        if not self.tls:
            return kind.insecure_channel(host, options=options)
        credentials = grpc.ssl_channel_credentials(root_certificates=self.ca,
                                                   private_key=self.key,
                                                   certificate_chain=self.cert)
        return kind.secure_channel(host, credentials, options=options)

    def ssl_context(self) -> ssl.SSLContext:
        """For an https:// server: the CA and client certificate of the settings."""
        context = ssl.create_default_context(cafile=self.settings.tls_ca or None)
        if self.settings.tls_cert:
            context.load_cert_chain(self.settings.tls_cert, self.settings.tls_key)
        return context
