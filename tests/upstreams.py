"""Stand-ins for a provider the recorder talks to (127.0.0.1 only): a scripted raw HTTP
upstream, and a TLS front (its own CA, made here) that passes bytes to a plain upstream."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h11


class FakeUpstream:
    """Accepts connections on 127.0.0.1 and runs ``handler(sock, request, body)`` for each
    request (one per connection); counts connections opened and seen closed by the peer."""

    def __init__(self, handler: Callable[[socket.socket, h11.Request, bytes], None]) -> None:
        self.handler = handler
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(256)
        self.port = self.lsock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.opened = 0
        self.closed_by_peer = 0
        self.requests: list[tuple[h11.Request, bytes]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                self.opened += 1
                self.socks.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s: socket.socket) -> None:
        """Requests one after the other on the connection (kept alive) until the peer
        closes it."""
        data = b""
        try:
            while True:
                conn = h11.Connection(h11.SERVER)
                if data:  # (what came after the previous request; b"" would mean EOF)
                    conn.receive_data(data)
                req = None
                body = b""
                while True:
                    ev = conn.next_event()
                    if ev is h11.NEED_DATA:
                        more = s.recv(65536)
                        if not more:
                            with self.lock:
                                self.closed_by_peer += 1
                            return
                        conn.receive_data(more)
                    elif isinstance(ev, h11.Request):
                        req = ev
                    elif isinstance(ev, h11.Data):
                        body += ev.data
                    elif isinstance(ev, h11.EndOfMessage):
                        break
                assert req is not None
                data = conn.trailing_data[0]
                with self.lock:
                    self.requests.append((req, body))
                self.handler(s, req, body)
        except OSError:
            pass
        finally:
            s.close()

    def close(self) -> None:
        self.stop.set()
        self.lsock.close()
        with self.lock:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# ------------------------------------------------------------------------------------------
# TLS
# ------------------------------------------------------------------------------------------

def make_ca(tmp: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for localhost / 127.0.0.1 signed by it:
    (ca.pem, server.pem, server.key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmsim test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (tmp / "ca.pem", tmp / "server.pem", tmp / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class TLSFront:
    """An https:// upstream on 127.0.0.1: terminates TLS with ``cert``/``key`` and passes the
    bytes to ``target_port``. Records the SNI names and the TLS connections it accepted."""

    def __init__(self, cert: Path, key: Path, target_port: int) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sni: list[str | None] = []
        self.ctx.sni_callback = self._sni
        self.target = target_port
        self.accepted = 0
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.url = f"https://localhost:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _sni(self, sock: Any, name: str | None, ctx: Any) -> None:
        self.sni.append(name)

    def _accept(self) -> None:
        while True:
            try:
                raw, _ = self.lsock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            tls = self.ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        self.accepted += 1
        back = socket.create_connection(("127.0.0.1", self.target))

        def pipe(a: socket.socket, b: socket.socket) -> None:
            try:
                while data := a.recv(65536):
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        t = threading.Thread(target=pipe, args=(back, tls), daemon=True)
        t.start()
        pipe(tls, back)
        t.join(30)
        tls.close()
        back.close()

    def close(self) -> None:
        self.lsock.close()


# ------------------------------------------------------------------------------------------
# WebSocket
# ------------------------------------------------------------------------------------------

class WSPeer:
    """The upstream's side of one WebSocket connection, for a :class:`FakeWSUpstream` script."""

    def __init__(self, sock: socket.socket, ws: Any) -> None:
        self.sock = sock
        self.ws = ws
        self.pending: list[Any] = []

    def send(self, text: str) -> None:
        from wsproto.events import TextMessage

        self.sock.sendall(self.ws.send(TextMessage(data=text)))

    def recv(self) -> str | None:
        """The client's next text message (None: it closed)."""
        from wsproto.events import CloseConnection, TextMessage

        parts: list[str] = []
        while True:
            while not self.pending:
                data = self.sock.recv(65536)
                self.ws.receive_data(data or None)
                self.pending.extend(self.ws.events())
                if not data and not self.pending:
                    return None
            ev = self.pending.pop(0)
            if isinstance(ev, CloseConnection):
                return None
            if isinstance(ev, TextMessage):
                parts.append(ev.data)
                if ev.message_finished:
                    return "".join(parts)

    def recv_type(self, etype: str) -> dict[str, Any]:
        import json

        while True:
            text = self.recv()
            assert text is not None, f"closed before {etype}"
            ev = json.loads(text)
            if ev.get("type") == etype:
                return ev  # type: ignore[no-any-return]

    def drop(self) -> None:
        """Close the TCP connection without a close frame."""
        self.sock.close()


class FakeWSUpstream:
    """A WebSocket upstream on 127.0.0.1: accepts the upgrade, then runs ``script(peer)``;
    counts connections, their handshakes' headers, and the ones the recorder closed."""

    def __init__(self, script: Callable[[WSPeer], None],
                 before_accept: Callable[[], None] | None = None) -> None:
        self.script = script
        self.before_accept = before_accept
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.opened = 0
        self.ended = 0  # connections whose peer (the recorder) closed them
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                self.opened += 1
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s: socket.socket) -> None:
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, Request

        ws = WSConnection(ConnectionType.SERVER)
        peer = WSPeer(s, ws)
        s.settimeout(30)
        try:
            while True:
                ws.receive_data(s.recv(65536))
                evs = list(ws.events())
                req = next((e for e in evs if isinstance(e, Request)), None)
                if req is not None:
                    with self.lock:
                        self.headers.append({k.decode().lower(): v.decode()
                                             for k, v in req.extra_headers})
                    if self.before_accept is not None:
                        self.before_accept()
                    s.sendall(ws.send(AcceptConnection()))
                    break
            self.script(peer)
            if s.fileno() >= 0:  # the script left it open: wait for the recorder to close
                while peer.recv() is not None:
                    pass
                with self.lock:
                    self.ended += 1
        except OSError:
            pass
        finally:
            s.close()

    def close(self) -> None:
        self.lsock.close()


def until(cond: Callable[[], Any], polls: int = 500) -> None:
    """Wait for ``cond`` (what the recorder does in the background), polling every 20 ms:
    the poll count only ends a hung test, it is no time budget."""
    for _ in range(polls):
        if cond():
            return
        time.sleep(0.02)
    assert cond(), "condition not reached"
