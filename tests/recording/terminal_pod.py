"""A pod with a terminal, played by the fake apiserver, and a real kubectl in a pseudo-terminal.

:class:`TerminalPod` answers ``exec``/``attach`` upgrades as the kubelet does, over WebSocket
(every subprotocol kube-apiserver accepts: binary ``v5``/``v4``/``channel.k8s.io`` and base64
``v4.base64``/``base64.channel.k8s.io``, whose frames are TEXT) and SPDY/3.1
(``v4.channel.k8s.io``): it prints a banner (with a multi-byte character cut across two
frames), echoes what is typed like a shell's line editor, keeps every terminal size the client
reports, and on ``exit`` says goodbye and ends with exit code :data:`EXIT_CODE` (a
``NonZeroExitCode`` Status on the error stream, as the kubelet writes it:
``pkg/kubelet/cri/streaming/remotecommand/httpstream.go``; before ``v4`` its message only).
Everything it sent on stdout is kept, to compare with the recording. ``big`` makes it print
that many bytes first. :class:`RawTerminal` is a browser terminal's side of the WebSocket.

:class:`PtyKubectl` runs kubectl with a pseudo-terminal for stdin/stdout (so ``-it`` has a
tty) and can resize it (``TIOCSWINSZ`` then ``SIGWINCH``, which kubectl's size monitor waits for).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import os
import signal
import struct
import subprocess
import tempfile
import termios
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import spdy
from tests.support.fake_apiserver import FakeAPIServer, UpgradeRequest
from tests.support.kube import _argv, _env
from tests.support.polling import wait_for
from tests.support.websocket import as_a_kubelet_starts, frame, read_frame

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
EXIT_CODE = 3
BANNER = ["welcome to the pod \u2713 ", "\x1b[1mbold\x1b[0m caf\u00e9\r\n$ "]
FAILURE = {"metadata": {}, "status": "Failure", "message": f"command terminated with non-zero exit code: {EXIT_CODE}",
           "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(EXIT_CODE)}]}}


@dataclass
class Seen:
    """One session as the pod saw it."""

    subresource: str
    transport: str
    query: dict[str, list[str]]
    stdout: bytearray = field(default_factory=bytearray)
    stdin: bytearray = field(default_factory=bytearray)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    subprotocol: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Session:
    """What the pod does, whatever the transport: ``out`` writes stdout, ``end`` the status."""

    def __init__(self, seen: Seen, out: Any, end: Any, big: int) -> None:
        self.seen, self._out, self._end, self._big = seen, out, end, big
        self._line = bytearray()
        self._resize = bytearray()

    def start(self) -> None:
        if self._big:
            block = (b"0123456789abcdef" * 4096)[:65536]
            left = self._big
            while left > 0:
                self.write(block[:min(left, len(block))])
                left -= len(block)
        first = BANNER[0].encode()
        self.write(first[:-2])  # the check mark's bytes cut across two frames
        self.write(first[-2:])
        self.write(BANNER[1].encode())
        if not _flag(self.seen, "stdin"):
            self._end()  # nothing will be typed: the command's output was all

    def write(self, data: bytes) -> None:
        self.seen.stdout += data
        self._out(data)

    def stdin(self, data: bytes) -> bool:
        """Echo; True when the user typed ``exit`` (the session then ends)."""
        self.seen.stdin += data
        self.write(data.replace(b"\r", b"\r\n"))
        self._line += data
        if b"exit\r" in self._line or b"exit\n" in self._line:
            self.write(b"bye\r\n")
            self._end()
            return True
        self._line = self._line[-16:]
        return False

    def resize(self, data: bytes) -> None:
        self._resize += data
        decoder = json.JSONDecoder()
        text = self._resize.decode()
        at = 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            try:
                doc, at = decoder.raw_decode(text, at)
            except ValueError:
                break
            self.seen.sizes.append((doc["Width"], doc["Height"]))
        self._resize = bytearray(text[at:].encode())


class TerminalPod:
    """The fake apiserver's upgrade handler for ``exec``/``attach`` with a tty."""

    def __init__(self, apiserver: FakeAPIServer) -> None:
        self.apiserver = apiserver
        self.sessions: list[Seen] = []
        self.big = 0

    def __call__(self, req: UpgradeRequest) -> None:
        recorded = self.apiserver.requests.last(req.info.path)
        query = urllib.parse.parse_qs(recorded.query if recorded is not None else "")
        upgrade = (req.info.headers.get("Upgrade") or "").lower()
        seen = Seen(req.info.subresource, upgrade, query)
        self.sessions.append(seen)
        try:
            if upgrade == "websocket":
                self._websocket(req, seen)
            elif upgrade == "spdy/3.1":
                self._spdy(req, seen)
            else:
                req.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        except OSError:
            pass
        finally:
            seen.done.set()

    def _websocket(self, req: UpgradeRequest, seen: Seen) -> None:
        headers = req.info.headers
        key = headers.get("Sec-WebSocket-Key") or ""
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode(), usedforsecurity=False).digest()).decode()
        offered = [p.strip() for p in (headers.get("Sec-WebSocket-Protocol") or "").split(",") if p.strip()]
        # wsstream's handshake: the first the client offers that the server supports ("" when none offered).
        chosen = next((p for p in offered or [""] if p in WS_PROTOCOLS), None)
        if chosen is None:
            req.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        seen.subprotocol = chosen
        named = f"Sec-WebSocket-Protocol: {chosen}\r\n" if chosen else ""
        req.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                         f"Sec-WebSocket-Accept: {accept}\r\n{named}\r\n").encode())
        codec = _WsCodec(chosen)
        lock = threading.Lock()

        def send(channel: int, data: bytes) -> None:
            with lock:
                req.wfile.write(codec.frame(channel, data))
                req.wfile.flush()

        def end() -> None:
            # v4 and later: a metav1.Status; before v4 the Status's message as text (the kubelet's
            # remotecommand/websocket.go and httpstream.go, v1WriteStatusFunc / v4WriteStatusFunc).
            send(3, json.dumps(FAILURE).encode() if codec.status_json else FAILURE["message"].encode())
            with lock:
                req.wfile.write(b"\x88\x02\x03\xe8")
                req.wfile.flush()

        session = _Session(seen, lambda data: send(1, data), end, self.big)
        req.sock.settimeout(30)
        send(1, b"")  # the kubelet's "connection established" (an empty message on stdout)
        as_a_kubelet_starts()
        session.start()
        while True:
            opcode, payload = read_frame(req.rfile)
            if opcode is None or opcode == 0x8:
                return
            if opcode not in (0x1, 0x2) or not payload:
                continue
            channel, data = codec.read(payload)
            if channel == 0 and session.stdin(data):
                _drain_websocket(req)
                return
            if channel == 4:
                session.resize(data)

    def _spdy(self, req: UpgradeRequest, seen: Seen) -> None:
        req.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                        b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
        conn = spdy.over_socket(req.sock, req.rfile, req.wfile)
        streams: dict[str, int] = {}
        wanted = {"error", "stdout"} | ({"stdin"} if _flag(seen, "stdin") else set()) \
            | (set() if _flag(seen, "tty") else {"stderr"})
        session: _Session | None = None

        def end() -> None:
            conn.data(streams["error"], json.dumps(FAILURE).encode(), fin=True)
            conn.data(streams["stdout"], fin=True)
            if "stderr" in streams:  # without a tty kubectl waits for stderr's end too
                conn.data(streams["stderr"], fin=True)

        while (got := conn.read_frame()) is not None:
            if got.control and got.kind == spdy.SYN_STREAM:
                streams[got.headers.get("streamtype", "")] = got.stream_id
                conn.reply(got.stream_id)
                if session is None and wanted <= set(streams) and ("resize" in streams or not _flag(seen, "tty")):
                    session = _Session(seen, lambda data: conn.data(streams["stdout"], data), end, self.big)
                    session.start()
            elif got.control and got.kind == spdy.PING:
                conn.pong(got)
            elif got.control and got.kind == spdy.GOAWAY:
                return
            elif not got.control and session is not None and got.stream_id == streams.get("stdin") and got.payload:
                session.stdin(got.payload)
            elif not got.control and session is not None and got.stream_id == streams.get("resize") and got.payload:
                session.resize(got.payload)


#: The subprotocols kube-apiserver (the kubelet's remotecommand/websocket.go) answers exec/attach with.
WS_PROTOCOLS = ("", "channel.k8s.io", "base64.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io",
                "v5.channel.k8s.io")
BASE64_PROTOCOLS = ("base64.channel.k8s.io", "v4.base64.channel.k8s.io")


@dataclass(frozen=True)
class _WsCodec:
    """wsstream/conn.go's two codecs: binary (channel byte, raw data) and base64 (channel digit,
    standard base64, sent in TEXT frames)."""

    protocol: str

    @property
    def base64(self) -> bool:
        return self.protocol in BASE64_PROTOCOLS

    @property
    def status_json(self) -> bool:
        return self.protocol.startswith(("v4.", "v5."))

    def frame(self, channel: int, data: bytes) -> bytes:
        if self.base64:
            return frame(0x1, bytes([ord("0") + channel]) + base64.b64encode(data))
        return frame(0x2, bytes([channel]) + data)

    def read(self, payload: bytes) -> tuple[int, bytes]:
        if self.base64:
            try:
                return payload[0] - ord("0"), base64.b64decode(payload[1:], validate=True)
            except binascii.Error:
                return -1, b""  # conn.go: a message that is not base64 is dropped
        return payload[0], payload[1:]


def _flag(seen: Seen, name: str) -> bool:
    return (seen.query.get(name) or ["false"])[0] in ("true", "1")


def _drain_websocket(req: UpgradeRequest) -> None:
    req.sock.settimeout(5)
    try:
        while read_frame(req.rfile)[0] not in (None, 0x8):
            pass
    except OSError:
        pass


class PtyKubectl:
    """kubectl with a pseudo-terminal as its stdin and stdout (stderr too)."""

    def __init__(self, args: Sequence[str], *, kubeconfig: Path, version: str | None = None,
                 size: tuple[int, int] = (100, 30)) -> None:
        self._home = tempfile.TemporaryDirectory(prefix="kubectl-home-")
        self.master, slave = os.openpty()
        self.resize(*size, signal_kubectl=False)
        self.proc = subprocess.Popen(_argv(args, kubeconfig, version, 30), stdin=slave, stdout=slave, stderr=slave,
                                     env={**_env(self._home.name), "TERM": "xterm"}, start_new_session=True)
        os.close(slave)
        self.output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    def resize(self, cols: int, rows: int, *, signal_kubectl: bool = True) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if signal_kubectl:
            os.kill(self.proc.pid, signal.SIGWINCH)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def wait_for(self, text: bytes, timeout: float = 30) -> None:
        wait_for(lambda: text in self.output, timeout, f"kubectl to show {text!r}; it showed {bytes(self.output)!r}")

    def finish(self, timeout: float = 30) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(10)
            self._reader.join(5)
            os.close(self.master)
            self._home.cleanup()
        return code


class RawTerminal:
    """A browser terminal's side of an exec/attach WebSocket (a real client, ``websocket-client``),
    speaking the one subprotocol it offers: TEXT frames of ``'0'+base64`` for the base64 codec,
    binary frames of ``channel byte + data`` for the binary one."""

    def __init__(self, url: str, *, token: str, ca_file: str, protocol: str) -> None:
        import websocket

        self.codec = _WsCodec(protocol)
        self.ws = websocket.create_connection(url, header=[f"Authorization: Bearer {token}"],
                                              subprotocols=[protocol] if protocol else None,
                                              sslopt={"ca_certs": ca_file}, timeout=30)
        self.streams: dict[int, bytearray] = {}
        self.closed = False

    @property
    def negotiated(self) -> str:
        return self.ws.getsubprotocol() or ""

    def send(self, channel: int, data: bytes) -> None:
        if self.codec.base64:
            self.ws.send(chr(ord("0") + channel) + base64.b64encode(data).decode())
        else:
            self.ws.send_binary(bytes([channel]) + data)

    def type(self, text: str) -> None:
        self.send(0, text.encode())

    def resize(self, cols: int, rows: int) -> None:
        self.send(4, json.dumps({"Width": cols, "Height": rows}).encode())

    def _read_message(self) -> None:
        import websocket

        try:
            opcode, payload = self.ws.recv_data()
        except websocket.WebSocketConnectionClosedException:
            self.closed = True  # cut without a close frame
            return
        if opcode == 0x8:
            self.closed = True
        elif opcode in (0x1, 0x2) and payload:
            got, data = self.codec.read(payload)
            self.streams.setdefault(got, bytearray()).extend(data)

    def read_until(self, channel: int, text: bytes) -> None:
        """Read messages until ``channel`` has shown ``text`` (or the server closed)."""
        while text not in self.streams.get(channel, b"") and not self.closed:
            self._read_message()
        assert text in self.streams.get(channel, b""), (channel, text, self.streams)

    def read_to_end(self) -> None:
        """Read until the server's close frame (the error channel's Status comes before it)."""
        while not self.closed:
            self._read_message()

    def exit_at_prompt(self) -> None:
        """Wait for the shell's prompt, type ``exit`` and read until the server closes."""
        self.read_until(1, b"$ ")
        self.type("exit\r")
        self.read_to_end()

    def close(self) -> None:
        try:
            self.ws.close(timeout=5)
        finally:
            self.ws.shutdown()  # close() leaves the socket open once the server's close frame was read

    def __enter__(self) -> RawTerminal:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
