"""Self-signed certificate authorities and certificates for the TLS tests (made with `cryptography`).

    pki = make_pki(tmp_path)           # a CA, a board cert, a client cert, and a second, unrelated CA
    pki.server_cert, pki.server_key    # for 127.0.0.1 and localhost, signed by pki.ca
    pki.client_cert, pki.client_key    # signed by pki.ca (mTLS)
    pki.other_ca                       # trusts nothing of the above
    pki.other_client_cert/_key         # signed by other_ca: an mTLS board must refuse it

Keys are EC P-256 (fast to make); everything is written as PEM into the given directory.
"""
import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Pki:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str
    other_client_cert: str
    other_client_key: str
    other_server_cert: str
    other_server_key: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory, name: str, data: bytes) -> str:
    path = os.path.join(os.fspath(directory), name)
    with open(path, "wb") as f:
        f.write(data)
    if name.endswith(".key"):
        os.chmod(path, 0o600)  # private, as hrt_boardd and the clients expect of a key (else they warn)
    return path


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, cn: str, server: bool):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.DNSName("board.bpuemu.test"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory) -> Pki:
    os.makedirs(os.fspath(directory), exist_ok=True)
    ca_key, ca_cert = _ca("bpuemu test CA")
    s_key, s_cert = _leaf(ca_key, ca_cert, "board.bpuemu.test", server=True)
    c_key, c_cert = _leaf(ca_key, ca_cert, "host.bpuemu.test", server=False)
    o_key, o_cert = _ca("some other CA")
    oc_key, oc_cert = _leaf(o_key, o_cert, "stranger.bpuemu.test", server=False)
    os_key, os_cert = _leaf(o_key, o_cert, "impostor.bpuemu.test", server=True)
    w = lambda name, data: _write(directory, name, data)  # noqa: E731
    return Pki(
        ca=w("ca.pem", _cert_pem(ca_cert)),
        server_cert=w("board.pem", _cert_pem(s_cert)), server_key=w("board.key", _key_pem(s_key)),
        client_cert=w("host.pem", _cert_pem(c_cert)), client_key=w("host.key", _key_pem(c_key)),
        other_ca=w("other-ca.pem", _cert_pem(o_cert)),
        other_client_cert=w("stranger.pem", _cert_pem(oc_cert)), other_client_key=w("stranger.key", _key_pem(oc_key)),
        other_server_cert=w("impostor.pem", _cert_pem(os_cert)), other_server_key=w("impostor.key", _key_pem(os_key)),
    )
