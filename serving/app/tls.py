"""`--ssl_config_file`: TF Serving's SSLConfig text proto, applied to gRPC and (beyond TF Serving) to REST.

The file is protobuf text format of `tensorflow.serving.SSLConfig`, parsed by protobuf's own text_format with
the message from the committed descriptor set (serving/protos/refresh.py), so stock TF Serving reads the same
file. Its fields hold PEM text, not paths:

    server_key: "-----BEGIN PRIVATE KEY-----\\n..."
    server_cert: "-----BEGIN CERTIFICATE-----\\n..."
    custom_ca: "-----BEGIN CERTIFICATE-----\\n..."   # the CA that signs client certificates
    client_verify: true                              # mutual TLS: a client without a certificate is refused

On the TLS port a plain HTTP request never reaches the API: the TLS handshake fails and the connection closes.
"""

from __future__ import annotations

import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import text_format

from serving import protos


class TlsConfigError(ValueError):
    """The SSL config file is unreadable, not SSLConfig text, or its PEM does not load."""


@dataclass(frozen=True)
class TlsConfig:
    """The PEM texts of one SSLConfig."""

    server_key: str
    server_cert: str
    custom_ca: str
    client_verify: bool

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for grpc.aio; `client_verify` requires a client certificate signed by `custom_ca`."""
        return grpc.ssl_server_credentials(
            [(self.server_key.encode(), self.server_cert.encode())],
            root_certificates=self.custom_ca.encode() or None,
            require_client_auth=self.client_verify,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS server context for REST with the same certificate, CA and client check as gRPC."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # load_cert_chain reads files only: the PEM goes through a private temporary folder, deleted at once.
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert.write_text(self.server_cert)
            key.touch(mode=0o600)
            key.write_text(self.server_key)
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                raise TlsConfigError(
                    f"server_key and server_cert do not load as a PEM key pair: {exc}"
                ) from exc
        if self.custom_ca:
            try:
                context.load_verify_locations(cadata=self.custom_ca)
            except ssl.SSLError as exc:
                raise TlsConfigError(f"custom_ca does not load as PEM certificates: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED if self.client_verify else ssl.CERT_NONE
        return context


def load_tls_config(path: Path) -> TlsConfig:
    """Parse and check an SSLConfig text file; TlsConfigError names the file and what to fix."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsConfigError(f"cannot read --ssl_config_file {path}: {exc}") from exc
    message = protos.message_class("tensorflow.serving.SSLConfig")()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise TlsConfigError(f"--ssl_config_file {path} is not SSLConfig text format: {exc}") from exc
    if not message.server_key or not message.server_cert:
        raise TlsConfigError(f"--ssl_config_file {path} needs both server_key and server_cert (PEM text)")
    if message.client_verify and not message.custom_ca:
        raise TlsConfigError(
            f"--ssl_config_file {path} sets client_verify but no custom_ca: add the CA that signs client certificates"
        )
    config = TlsConfig(message.server_key, message.server_cert, message.custom_ca, message.client_verify)
    config.ssl_context()  # the PEM must load now, not at the first connection
    return config
