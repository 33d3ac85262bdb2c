"""`--ssl_config_file`: TLS and mutual TLS on gRPC and REST, with a self-signed CA made here; plain HTTP refused."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from tests.helpers import REPO_ROOT
from tests.serving.model_repo import make_weights, write_version
from tests.serving.server_process import ServerProcess, http


@dataclass(frozen=True)
class Pem:
    key: bytes
    cert: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(cn: str, issuer: Pem | None, server: bool) -> Pem:
    """A P-256 certificate for `cn` signed by `issuer` (None: self-signed CA); servers get SAN 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    signer_key = key if issuer is None else serialization.load_pem_private_key(issuer.key, None)
    issuer_name = _name(cn) if issuer is None else x509.load_pem_x509_certificate(issuer.cert).subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    cert = builder.sign(signer_key, hashes.SHA256())  # type: ignore[arg-type]
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return Pem(key_pem, cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class Certificates:
    ca: Pem
    server: Pem
    client: Pem


@pytest.fixture(scope="module")
def certs() -> Certificates:
    ca = _issue("ctr test CA", None, server=False)
    return Certificates(ca, _issue("ctr server", ca, server=True), _issue("ctr client", ca, server=False))


def _quoted(pem: bytes) -> str:
    return '"' + pem.decode().replace("\n", "\\n") + '"'


def write_ssl_config(path: Path, certs: Certificates, client_verify: bool) -> Path:
    """TF Serving's SSLConfig text format, PEM inline."""
    path.write_text(
        f"server_key: {_quoted(certs.server.key)}\n"
        f"server_cert: {_quoted(certs.server.cert)}\n"
        f"custom_ca: {_quoted(certs.ca.cert)}\n"
        f"client_verify: {'true' if client_verify else 'false'}\n"
    )
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("tls") / "ctr"
    write_version(repo, 1, make_weights(seed=1))
    return repo


def _start(base: Path, folder: Path, config: Path) -> ServerProcess:
    proc = ServerProcess(base, folder / "server.log", f"--ssl_config_file={config}")
    proc.url = lambda path: f"https://127.0.0.1:{proc.rest_port}{path}"  # type: ignore[method-assign]
    return proc


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, base: Path, certs: Certificates
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("tls_server")
    proc = _start(base, folder, write_ssl_config(folder / "ssl.pbtxt", certs, client_verify=False))
    _wait_https(proc, _client_context(certs, with_cert=False))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def mtls_server(
    tmp_path_factory: pytest.TempPathFactory, base: Path, certs: Certificates
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("mtls_server")
    proc = _start(base, folder, write_ssl_config(folder / "ssl.pbtxt", certs, client_verify=True))
    _wait_https(proc, _client_context(certs, with_cert=True))
    yield proc
    proc.stop()


def _client_context(certs: Certificates, with_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=certs.ca.cert.decode())
    if with_cert:
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder) / "c.pem", Path(folder) / "k.pem"
            cert.write_bytes(certs.client.cert)
            key.write_bytes(certs.client.key)
            context.load_cert_chain(cert, key)
    return context


def _https(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _wait_https(proc: ServerProcess, context: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.log()
        try:
            if _https(proc.url("/v1/models/ctr"), context)[0] == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(proc.log())


def _status_over_grpc(target: str, credentials: grpc.ChannelCredentials | None) -> int:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "ctr"
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    with channel:
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=5)
    return response.model_version_status[0].version


def test_rest_over_https_answers_and_plain_http_is_refused(
    tls_server: ServerProcess, certs: Certificates
) -> None:
    status, body = _https(tls_server.url("/v2/health/ready"), _client_context(certs, with_cert=False))
    assert (status, body) == (200, b'{"ready":true}')
    plain = f"http://127.0.0.1:{tls_server.rest_port}/v1/models/ctr"
    assert http(plain) == (0, None)  # the TLS handshake fails: the request never reaches the API
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _https(
            tls_server.url("/v1/models/ctr"), ssl.create_default_context()
        )  # a client that does not trust the CA


def test_grpc_over_tls_answers_and_plaintext_is_refused(
    tls_server: ServerProcess, certs: Certificates, tmp_path: Path
) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.ca.cert)
    assert _status_over_grpc(tls_server.grpc_target, credentials) == 1
    with pytest.raises(grpc.RpcError) as caught:
        _status_over_grpc(tls_server.grpc_target, None)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(certs.ca.cert)  # tritonclient takes the CA as a file
    client = triton.InferenceServerClient(tls_server.grpc_target, ssl=True, root_certificates=str(ca_file))
    tensor = triton.InferInput("features", [1, 128], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 128), np.float32))
    assert client.infer("ctr", [tensor]).as_numpy("ctr").shape == (1, 1)
    client.close()


def test_mutual_tls_requires_a_client_certificate_on_both_ports(
    mtls_server: ServerProcess, certs: Certificates
) -> None:
    assert _https(mtls_server.url("/v1/models/ctr"), _client_context(certs, with_cert=True))[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        _https(mtls_server.url("/v1/models/ctr"), _client_context(certs, with_cert=False))
    with_cert = grpc.ssl_channel_credentials(certs.ca.cert, certs.client.key, certs.client.cert)
    assert _status_over_grpc(mtls_server.grpc_target, with_cert) == 1
    with pytest.raises(grpc.RpcError) as caught:
        _status_over_grpc(mtls_server.grpc_target, grpc.ssl_channel_credentials(certs.ca.cert))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("server_key: 3 oops", "is not SSLConfig text format"),
        ('server_key: "x"', "needs both server_key and server_cert (PEM text)"),
        ('server_key: "x"\nserver_cert: "y"', "server_key and server_cert do not load as a PEM key pair"),
    ],
)
def test_bad_ssl_config_file_exits_with_one_line(tmp_path: Path, base: Path, text: str, error: str) -> None:
    config = tmp_path / "ssl.pbtxt"
    config.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "serving", f"--model_base_path={base}", f"--ssl_config_file={config}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()  # the error alone: no usage block before it
    assert line.startswith("python -m serving: error: ") and error in line
