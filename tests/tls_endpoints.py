"""TLS endpoints for tests: a throwaway CA with server and client certificates (made with
``cryptography`` in a directory), and a TLS-terminating proxy in front of the suite's
plain Temporal dev server or Redis (asyncio ``start_server`` with an SSL context, piping
bytes), optionally asking for a client certificate and reading the gRPC request headers
(HTTP/2 HEADERS frames, HPACK-decoded) that go through it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass(frozen=True)
class Pki:
    """PEM files of one throwaway CA and the certificates it issued."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_pki(directory: Path, name: str = "test") -> Pki:
    """A CA, a server certificate for ``localhost`` / ``127.0.0.1`` and a client
    certificate, as PEM files in ``directory`` (prefixed ``name``)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())

    def issued(subject: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.CertificateBuilder:
        """A day-long certificate of ``key`` signed by the CA: a CA signs certificates,
        a leaf signs handshakes."""
        usage = (False, False, False, False, False, True, True, False, False) if ca else (True,) + (False,) * 8
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(*usage), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )

    ca = issued(ca_name, ca_key, ca=True).sign(ca_key, hashes.SHA256())

    def leaf(common_name: str, usage: x509.ObjectIdentifier) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            issued(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]), key, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert, key

    server, server_key = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH)
    client, client_key = leaf("hermes-worker", ExtendedKeyUsageOID.CLIENT_AUTH)
    pki = Pki(*(directory / f"{name}-{part}.pem" for part in ("ca", "server", "server-key", "client", "client-key")))
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.server_key.write_bytes(_key_pem(server_key))
    pki.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    pki.client_key.write_bytes(_key_pem(client_key))
    return pki


class Http2HeaderTap:
    """Reads the client-to-server bytes of one HTTP/2 connection and keeps the header
    lists of its requests (HEADERS + CONTINUATION frames, HPACK-decoded in order)."""

    def __init__(self, into: list[dict[str, str]]):
        from hpack import Decoder

        logging.getLogger("hpack").setLevel(logging.WARNING)  # it logs every header it decodes
        self._decoder = Decoder()
        self._buffer = b""
        self._preface_seen = False
        self._block = b""
        self.requests = into

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if not self._preface_seen:
            if len(self._buffer) < len(HTTP2_PREFACE):
                return
            if not self._buffer.startswith(HTTP2_PREFACE):
                raise ValueError("not an HTTP/2 connection")
            self._buffer = self._buffer[len(HTTP2_PREFACE):]
            self._preface_seen = True
        while len(self._buffer) >= 9:
            length = int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < 9 + length:
                return
            kind, flags = self._buffer[3], self._buffer[4]
            payload, self._buffer = self._buffer[9 : 9 + length], self._buffer[9 + length :]
            if kind == 0x1:  # HEADERS
                if flags & 0x8:  # PADDED
                    payload = payload[1 : len(payload) - payload[0]]
                if flags & 0x20:  # PRIORITY
                    payload = payload[5:]
                self._block = payload
            elif kind == 0x9:  # CONTINUATION
                self._block += payload
            else:
                continue
            if flags & 0x4:  # END_HEADERS
                self.requests.append(dict(self._decoder.decode(self._block)))
                self._block = b""


@dataclass
class TlsProxy:
    """A TLS-terminating proxy: ``address`` (``127.0.0.1:port``) forwards every accepted
    connection to ``upstream`` in plain TCP."""

    address: str
    connections: int = 0
    """Connections whose TLS handshake succeeded and that reached the upstream."""
    headers: list[dict[str, str]] = field(default_factory=list)
    """With ``read_http2_headers``: the header list of every request, in order."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tap: Http2HeaderTap | None) -> None:
    try:
        while data := await reader.read(65536):
            if tap is not None:
                tap.feed(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


@contextlib.asynccontextmanager
async def tls_proxy(
    upstream: str,
    pki: Pki,
    *,
    require_client_cert: bool = False,
    read_http2_headers: bool = False,
) -> AsyncIterator[TlsProxy]:
    """Serve TLS with ``pki``'s server certificate on a free port of 127.0.0.1, piping
    the plain bytes to ``upstream`` (``host:port``).

    Args:
        upstream: the plain server.
        pki: whose server certificate is presented and whose CA checks client certificates.
        require_client_cert: mutual TLS: a client without a certificate of ``pki``'s CA is
            refused in the handshake.
        read_http2_headers: decode the requests' HTTP/2 headers into ``TlsProxy.headers``.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.set_alpn_protocols(["h2"])  # gRPC clients insist on HTTP/2 by ALPN
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca)
    host, port = upstream.rsplit(":", 1)
    tasks: set[asyncio.Task[None]] = set()
    proxy = TlsProxy(address="")

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        proxy.connections += 1
        tap = Http2HeaderTap(proxy.headers) if read_http2_headers else None
        both = asyncio.gather(_pipe(client_reader, upstream_writer, tap), _pipe(upstream_reader, client_writer, None))
        task = asyncio.ensure_future(both)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    proxy.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5.0)
