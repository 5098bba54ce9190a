"""A throwaway certificate authority for the TLS Redis tests (the `cryptography` package, no
openssl CLI): a CA, a server certificate for loopback (127.0.0.1 and localhost, also a
client certificate: the servers present it to each other, replication and the cluster bus),
a client certificate for the governor, and a second CA that signed none of them."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # the CA that signed the servers' and the client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here

    def server_args(self) -> list[str]:
        """redis-server's TLS options (clients must present a certificate of `ca`)."""
        return ["--tls-cert-file", str(self.server_cert), "--tls-key-file", str(self.server_key),
                "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes"]

    def cli_args(self) -> list[str]:
        return ["--tls", "--cacert", str(self.ca), "--cert", str(self.server_cert), "--key", str(self.server_key)]

    def client_kwargs(self) -> dict[str, object]:
        """redis-py's TLS options for the tests' own clients."""
        return dict(ssl=True, ssl_ca_certs=str(self.ca), ssl_certfile=str(self.client_cert),
                    ssl_keyfile=str(self.client_key))

    def query(self) -> str:
        """The store URL's TLS options: the CA pinned, the client certificate presented."""
        return f"ssl_ca_certs={self.ca}&ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _ca(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(common: str, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, *, server: bool
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.timezone.utc)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(ca.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if server:  # the addresses the clients dial, and the ones Sentinel and CLUSTER SLOTS name
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("governor test CA")
    other, _ = _ca("another CA")
    server, server_key = _leaf("redis", ca, ca_key, server=True)
    client, client_key = _leaf("governor", ca, ca_key, server=False)
    files = TlsFiles(ca=directory / "ca.crt", server_cert=directory / "server.crt", server_key=directory / "server.key",
                     client_cert=directory / "client.crt", client_key=directory / "client.key",
                     other_ca=directory / "other-ca.crt")
    for path, cert in ((files.ca, ca), (files.other_ca, other), (files.server_cert, server),
                       (files.client_cert, client)):
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.server_key, server_key)
    _write_key(files.client_key, client_key)
    return files
