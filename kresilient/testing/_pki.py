"""A throw-away certificate authority for secured test clusters (TLS and mutual TLS).

Generated in-process with Python's ``cryptography`` package rather than the JDK's
``keytool``: one ``keytool`` call starts a JVM (0.5-2 s each on a loaded 2-core machine) and a
cluster needs about eight of them (CA, signing requests, imports, exports), while
``cryptography`` makes the whole set in milliseconds, and writes the PEM files librdkafka
reads directly (``keytool`` cannot export a private key). EC P-256 keys: fast to generate,
read by Java 17+ and by librdkafka's OpenSSL.

Files (all inside the cluster's data directory, removed by ``close()``):

- ``ca.pem``: the CA certificate (librdkafka ``ssl.ca.location``; the brokers' PEM
  truststore);
- ``broker.p12``: the brokers' key and certificate (PKCS12, read by the JVM; SAN
  ``127.0.0.1`` and ``localhost``, so hostname verification stays on);
- ``<name>.pem`` / ``<name>.key``: a client's certificate and its private key, PKCS8 PEM
  encrypted with the key password (``ssl.certificate.location`` / ``ssl.key.location`` /
  ``ssl.key.password``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from kresilient.errors import ClusterError

try:  # an optional dependency: only secured clusters need it
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as exc:  # pragma: no cover - depends on the environment
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

__all__ = ["CertificateAuthority", "ClientCertificate"]


def new_secret(prefix: str) -> str:
    """A random password, distinctive enough to search captured output for it."""
    return f"{prefix}-{secrets.token_urlsafe(18)}"


@dataclass(frozen=True)
class ClientCertificate:
    """A client certificate on disk, with the settings librdkafka needs to present it."""

    name: str
    certificate: Path
    key: Path
    key_password: str = field(repr=False)

    def client_settings(self) -> dict[str, str]:
        """``ssl.certificate.location`` / ``ssl.key.location`` / ``ssl.key.password``."""
        return {
            "ssl.certificate.location": str(self.certificate),
            "ssl.key.location": str(self.key),
            "ssl.key.password": self.key_password,
        }

    def __repr__(self) -> str:
        return f"ClientCertificate(name={self.name!r}, certificate={str(self.certificate)!r})"


class CertificateAuthority:
    """A CA that issues broker and client certificates into ``directory``.

    Tests may create a second, unrelated one to present a certificate the cluster does not
    trust (the "wrong CA" case).
    """

    def __init__(self, directory: str | Path, *, name: str = "kresilient test CA") -> None:
        if _MISSING is not None:
            raise ClusterError(
                "secured clusters (security='ssl' or 'sasl_ssl') generate certificates with "
                "the 'cryptography' package: pip install cryptography"
            ) from _MISSING
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._subject = subject
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_path = self.directory / "ca.pem"
        self.ca_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def __repr__(self) -> str:
        return f"CertificateAuthority(directory={str(self.directory)!r})"

    def _issue(
        self, cn: str, *, server: bool, expired: bool
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        if expired:
            begin, end = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
        else:
            begin, end = now - dt.timedelta(hours=1), now + dt.timedelta(days=30)
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usage.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(begin)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
        return key, builder.sign(self._key, hashes.SHA256())

    def broker_keystore(self, password: str) -> Path:
        """``broker.p12``: the brokers' key and certificate chain, protected by ``password``."""
        key, cert = self._issue("kafka-broker", server=True, expired=False)
        data = pkcs12.serialize_key_and_certificates(
            b"broker",
            key,
            cert,
            [self._cert],
            serialization.BestAvailableEncryption(password.encode()),
        )
        path = self.directory / "broker.p12"
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def client_certificate(
        self, name: str, key_password: str, *, expired: bool = False
    ) -> ClientCertificate:
        """Issue ``CN=<name>`` (the broker maps it to principal ``User:<name>``).

        ``expired=True`` issues one whose validity ended yesterday.
        """
        key, cert = self._issue(name, server=False, expired=expired)
        stem = f"{name}-expired" if expired else name
        cert_path = self.directory / f"{stem}.pem"
        key_path = self.directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(key_password.encode()),
            )
        )
        key_path.chmod(0o600)
        return ClientCertificate(name, cert_path, key_path, key_password)
