"""TLS on the HTTP and gRPC frontends (server-only and mutual), with certificates made here and tritonclient's ssl options."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from tritonclient.utils import InferenceServerException

from tests.support.onnx_models import add_sub_model
from tests.support.servers import start_server


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path  # signed by a CA the server does not trust
    other_client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _sign(subject: str, key, issuer: x509.Name, issuer_key, *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False), critical=True)
    elif server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate | None = None, key=None) -> Path:
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key, other_ca_key = _key(), _key()
    ca = _sign("naiad test CA", ca_key, _name("naiad test CA"), ca_key, ca=True)
    other_ca = _sign("untrusted CA", other_ca_key, _name("untrusted CA"), other_ca_key, ca=True)
    server_key, client_key, other_key = _key(), _key(), _key()
    server = _sign("127.0.0.1", server_key, ca.subject, ca_key, server=True)
    client = _sign("naiad client", client_key, ca.subject, ca_key)
    other = _sign("intruder", other_key, other_ca.subject, other_ca_key)
    return Pki(
        ca=_write(root / "ca.pem", ca),
        server_cert=_write(root / "server.pem", server), server_key=_write(root / "server.key", key=server_key),
        client_cert=_write(root / "client.pem", client), client_key=_write(root / "client.key", key=client_key),
        other_client_cert=_write(root / "other.pem", other), other_client_key=_write(root / "other.key", key=other_key),
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("tlsrepo")
    add_sub_model(root, "add_sub")
    return root


# every port in the server process, and every connection handed to a frontend worker (its TLS handshake there)
LAYOUTS = {"one-process": (), "frontend-worker": ("--frontend-processes", "1", "--frontend-core-connections", "0")}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request) -> tuple[str, ...]:
    return LAYOUTS[request.param]


@pytest.fixture(scope="module")
def tls_server(repo, pki, layout):
    """HTTPS and gRPC over TLS, server authentication only."""
    with start_server(
        repo, *layout,
        "--http-ssl-certfile", str(pki.server_cert), "--http-ssl-keyfile", str(pki.server_key),
        "--grpc-use-ssl=true", "--grpc-server-cert", str(pki.server_cert), "--grpc-server-key", str(pki.server_key),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def mutual_server(repo, pki, layout):
    """HTTPS and gRPC with client certificates required (signed by the test CA)."""
    with start_server(
        repo, *layout,
        "--http-ssl-certfile", str(pki.server_cert), "--http-ssl-keyfile", str(pki.server_key),
        "--http-ssl-ca-certs", str(pki.ca), "--http-ssl-client-cert-required=true",
        "--grpc-use-ssl-mutual=true", "--grpc-server-cert", str(pki.server_cert),
        "--grpc-server-key", str(pki.server_key), "--grpc-root-cert", str(pki.ca),
    ) as server:
        yield server


def _inputs(module, binary: bool = True):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.float32)
    tensors = [module.InferInput("INPUT0", [1, 16], "FP32"), module.InferInput("INPUT1", [1, 16], "FP32")]
    for tensor, data in zip(tensors, (a, b)):
        if module is httpclient:
            tensor.set_data_from_numpy(data, binary_data=binary)
        else:
            tensor.set_data_from_numpy(data)
    return tensors, a + b


def _https_client(server, pki: Pki, cert: Path | None = None, key: Path | None = None) -> httpclient.InferenceServerClient:
    def factory():
        context = ssl.create_default_context(cafile=str(pki.ca))
        if cert is not None:
            context.load_cert_chain(str(cert), str(key))
        return context

    return httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_context_factory=factory, network_timeout=20)


def _grpc_client(server, pki: Pki, cert: Path | None = None, key: Path | None = None) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=str(pki.ca),
        private_key=str(key) if key else None, certificate_chain=str(cert) if cert else None,
    )


def test_https_serves_tritonclient_with_ca_verification(tls_server, pki):
    client = _https_client(tls_server, pki)
    assert client.is_server_ready()
    inputs, expected = _inputs(httpclient)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.close()


def test_https_port_refuses_plain_http(tls_server):
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(f"http://{tls_server.http_url}/v2/health/ready", timeout=10).read()


def test_https_certificate_is_checked_by_clients_that_do_not_trust_the_ca(tls_server):
    context = ssl.create_default_context()  # system roots only: the test CA is unknown
    with pytest.raises(urllib.error.URLError) as info:
        urllib.request.urlopen(f"https://{tls_server.http_url}/v2/health/ready", timeout=10, context=context)
    assert isinstance(info.value.reason, ssl.SSLCertVerificationError)


def test_grpc_tls_serves_tritonclient(tls_server, pki):
    client = _grpc_client(tls_server, pki)
    assert client.is_server_live()
    inputs, expected = _inputs(grpcclient)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    client.close()


def test_grpc_tls_negotiates_h2_with_alpn(tls_server, pki):
    """gRPC clients require ALPN "h2"; the server then speaks HTTP/2 first (its SETTINGS frame)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection(("127.0.0.1", tls_server.grpc_port), timeout=20) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.selected_alpn_protocol() == "h2"
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            head = b""
            while len(head) < 9:
                chunk = tls.recv(9 - len(head))
                assert chunk, "the server closed the TLS connection"
                head += chunk
            assert head[3] == 0x4  # SETTINGS


def test_grpc_tls_port_refuses_plaintext_clients(tls_server):
    client = grpcclient.InferenceServerClient(tls_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live(client_timeout=10)
    assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    client.close()


def test_mutual_https_accepts_a_client_certificate_from_the_trusted_ca(mutual_server, pki):
    client = _https_client(mutual_server, pki, pki.client_cert, pki.client_key)
    inputs, expected = _inputs(httpclient, binary=False)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), expected)
    client.close()


@pytest.mark.parametrize("use_other_ca", [False, True], ids=["no-certificate", "untrusted-certificate"])
def test_mutual_https_refuses_other_clients(mutual_server, pki, use_other_ca):
    context = ssl.create_default_context(cafile=str(pki.ca))
    if use_other_ca:
        context.load_cert_chain(str(pki.other_client_cert), str(pki.other_client_key))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(f"https://{mutual_server.http_url}/v2/health/ready", timeout=10, context=context).read()


def test_mutual_grpc_accepts_a_client_certificate_from_the_trusted_ca(mutual_server, pki):
    client = _grpc_client(mutual_server, pki, pki.client_cert, pki.client_key)
    assert client.is_server_ready()
    inputs, expected = _inputs(grpcclient)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), expected)
    client.close()


@pytest.mark.parametrize("use_other_ca", [False, True], ids=["no-certificate", "untrusted-certificate"])
def test_mutual_grpc_refuses_other_clients(mutual_server, pki, use_other_ca):
    cert, key = (pki.other_client_cert, pki.other_client_key) if use_other_ca else (None, None)
    client = _grpc_client(mutual_server, pki, cert, key)
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live(client_timeout=10)
    assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
    client.close()


def test_tls_flags_without_certificates_are_refused_at_start(repo):
    import subprocess
    import sys

    for flags, message in (
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--http-ssl-certfile", "x.pem", "--http-ssl-client-cert-required=true"], "needs --http-ssl-ca-certs"),
    ):
        process = subprocess.run([sys.executable, "-m", "naiad", "serve", "--model-repository", str(repo), *flags],
                                 capture_output=True, text=True, timeout=60)
        assert process.returncode != 0 and message in process.stderr, process.stderr
