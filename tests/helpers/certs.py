"""Certificates made at test time (the `cryptography` package): a CA, a server certificate for
127.0.0.1 / localhost, and a client certificate for mutual TLS, all signed by that CA; plus a
second, unrelated CA (a certificate the services must not trust)."""
import datetime
import ipaddress
import pathlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # a CA that signed nothing the services know
    other_client_cert: str  # a client certificate signed by other_ca
    other_client_key: str


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: pathlib.Path, key=None, cert=None) -> str:
    from cryptography.hazmat.primitives import serialization

    if key is not None:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    else:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, sans=None, client=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def make_certs(directory) -> Certs:
    from cryptography import x509

    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = _key(), _key()
    ca = _cert("tandem test CA", ca_key, None, None, ca=True)
    other = _cert("unrelated CA", other_key, None, None, ca=True)
    server_key, client_key, other_client_key = _key(), _key(), _key()
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _cert("tandem service", server_key, ca.subject, ca_key, ca=False, sans=sans)
    client = _cert("tandem controller", client_key, ca.subject, ca_key, ca=False, client=True)
    other_client = _cert("stranger", other_client_key, other.subject, other_key, ca=False, client=True)
    return Certs(_write(d / "ca.pem", cert=ca), _write(d / "server.pem", cert=server),
                 _write(d / "server.key", key=server_key), _write(d / "client.pem", cert=client),
                 _write(d / "client.key", key=client_key), _write(d / "other_ca.pem", cert=other),
                 _write(d / "stranger.pem", cert=other_client), _write(d / "stranger.key", key=other_client_key))


def tls_overrides(role: str, certs: Certs, *, mutual: bool = False) -> list[str]:
    """Config overrides turning TLS on for services.<role> (mutual: the controller shows its certificate)."""
    key = f"services.{role}.tls"
    out = [f"{key}.enable=true", f"{key}.cert_file={certs.server_cert}", f"{key}.key_file={certs.server_key}",
           f"{key}.ca_file={certs.ca}"]
    if mutual:
        out += [f"{key}.client_auth=true", f"{key}.client_cert_file={certs.client_cert}",
                f"{key}.client_key_file={certs.client_key}"]
    return out
