"""A throwaway certificate authority for ``basalt cluster up --tls`` and the tests.

:func:`make_cluster_certificates` writes, into one directory::

    ca.pem, ca-key.pem          the CA (self-signed, 1 year)
    node.pem, node-key.pem      etcd's and every service's certificate: server and
                                client use (they dial each other and etcd with it)
    client.pem, client-key.pem  the tools' certificate (CLI, SDK): client use only

Every leaf names ``localhost``, ``127.0.0.1`` and ``::1``: the local cluster
serves on loopback. Keys are ECDSA P-256 (small, fast handshakes), written
0600. Nothing here is fit for production: a deployment brings certificates
from its own CA (cert-manager, a Secret: docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from basalt.common.local_cluster import CA_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE
from basalt.common.tls import ClientAuth, TlsConfig

NODE_CERT_FILE = "node.pem"
NODE_KEY_FILE = "node-key.pem"
CA_KEY_FILE = "ca-key.pem"
#: What a leaf certificate is valid for on loopback.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True, slots=True)
class Authority:
    """A CA: its certificate and key, to sign leaves with."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, common_name: str = "Basalt local CA") -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)

    def write(self, cert_path: Path, key_path: Path | None = None) -> None:
        """The CA certificate (and, given a path, its key) as PEM."""
        _write(cert_path, self.certificate.public_bytes(serialization.Encoding.PEM))
        if key_path is not None:
            _write(key_path, _key_pem(self.key), private=True)

    def issue(
        self,
        cert_path: Path,
        key_path: Path,
        *,
        common_name: str,
        server: bool = True,
        client: bool = True,
        names: tuple[str, ...] = LOOPBACK_NAMES,
    ) -> None:
        """Sign a fresh key's certificate for ``names`` (DNS names and IP
        addresses) and write both; ``server``/``client``: its extended key usages.
        Each file is written whole and renamed into place (a server re-reading
        them never sees half a file)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [
            ExtendedKeyUsageOID.CLIENT_AUTH
        ] * client
        alternative: list[x509.GeneralName] = []
        for name in names:
            try:
                alternative.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternative.append(x509.DNSName(name))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        _write(key_path, _key_pem(key), private=True)
        _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(temporary, path)


@dataclass(frozen=True, slots=True)
class ClusterCertificates:
    """Where :func:`make_cluster_certificates` put the files."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / CA_FILE

    def node_tls(self) -> TlsConfig:
        """What etcd and every service serve and dial with: mutual TLS."""
        return TlsConfig(
            tls_enable=True,
            tls_cert_file=self.directory / NODE_CERT_FILE,
            tls_key_file=self.directory / NODE_KEY_FILE,
            tls_ca_file=self.ca_file,
            tls_client_auth=ClientAuth.REQUIRE,
        )

    def client_tls(self) -> TlsConfig:
        """What the tools and the SDK dial with."""
        return TlsConfig(
            tls_enable=True,
            tls_cert_file=self.directory / CLIENT_CERT_FILE,
            tls_key_file=self.directory / CLIENT_KEY_FILE,
            tls_ca_file=self.ca_file,
        )

    def service_flags(self) -> list[str]:
        """:meth:`node_tls` as a service's command-line flags."""
        tls = self.node_tls()
        return [
            "--tls-enable", "true",
            "--tls-cert-file", str(tls.tls_cert_file),
            "--tls-key-file", str(tls.tls_key_file),
            "--tls-ca-file", str(tls.tls_ca_file),
            "--tls-client-auth", "REQUIRE",
        ]  # fmt: skip


def make_cluster_certificates(
    directory: Path, *, hosts: tuple[str, ...] = ()
) -> ClusterCertificates:
    """A new CA and its node and client certificates in ``directory`` (created;
    files there replaced): see the module's docstring. ``hosts``: more names
    the node certificate is valid for (compose's service names: ``etcd``,
    ``store-node-a`` ...), beside loopback's."""
    authority = Authority.create()
    authority.write(directory / CA_FILE, directory / CA_KEY_FILE)
    authority.issue(
        directory / NODE_CERT_FILE,
        directory / NODE_KEY_FILE,
        common_name="basalt-node",
        names=(*LOOPBACK_NAMES, *hosts),
    )
    authority.issue(
        directory / CLIENT_CERT_FILE,
        directory / CLIENT_KEY_FILE,
        common_name="basalt-client",
        server=False,
    )
    return ClusterCertificates(directory)
