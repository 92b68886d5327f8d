"""A small HTTP/1.1 client for the upload tests: multipart bodies, streamed or chunked.

It reads the response while it is still sending the body, the way curl does, so a
server that refuses an upload early (413) is heard instead of surfacing as a broken
pipe; and it can send without Content-Length (chunked), to show the server counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    sent_bytes: int = 0  # of the request body, before the response ended the upload

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def multipart(
    data: bytes | None, filename: str = "audio.bin", **fields: str
) -> tuple[str, list[bytes]]:
    """(content type, body pieces) of a form with text `fields` and a `file` part."""
    boundary = "parley" + secrets.token_hex(8)
    pieces: list[bytes] = []
    for name, value in fields.items():
        disposition = f'Content-Disposition: form-data; name="{name}"'
        pieces.append(f"--{boundary}\r\n{disposition}\r\n\r\n{value}\r\n".encode())
    if data is not None:
        pieces.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
        )
        pieces.extend(data[i : i + (64 << 10)] for i in range(0, len(data), 64 << 10))
        pieces.append(b"\r\n")
    pieces.append(f"--{boundary}--\r\n".encode())
    return f"multipart/form-data; boundary={boundary}", pieces


def endless_file(size: int, filename: str = "big.wav") -> tuple[str, AsyncIterator[bytes]]:
    """A multipart form whose `file` part is `size` zero bytes, made as it is sent."""
    boundary = "parley" + secrets.token_hex(8)

    async def pieces() -> AsyncIterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\n\r\n'
        ).encode()
        block = bytes(64 << 10)
        for offset in range(0, size, len(block)):
            yield block[: size - offset]
        yield f"\r\n--{boundary}--\r\n".encode()

    return f"multipart/form-data; boundary={boundary}", pieces()


async def request(
    method: str,
    url: str,
    *,
    body: Iterable[bytes] | AsyncIterator[bytes] = (),
    headers: dict[str, str] | None = None,
    chunked: bool = False,
    params: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> HttpResponse:
    """Send one request on a fresh connection and read the whole response.

    On a bare socket, not asyncio's streams: a server that answers early and closes with
    the upload unread resets the connection, and a send that meets the reset would make
    a stream transport drop the response already received; here the sender just stops,
    and the response is read from the socket's queue, which the reset leaves in place."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if params:
        target += ("&" if "?" in target else "?") + urlencode(params)
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (
        await loop.getaddrinfo(parts.hostname, parts.port, type=socket.SOCK_STREAM)
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    pieces = body if isinstance(body, AsyncIterator) else _aiter(list(body))
    head = {"Host": parts.netloc, "Connection": "close", **(headers or {})}
    if chunked:
        head["Transfer-Encoding"] = "chunked"
    elif not isinstance(body, AsyncIterator):
        head["Content-Length"] = str(sum(len(p) for p in body))
    sent = 0

    async def send() -> None:
        nonlocal sent
        await loop.sock_sendall(
            sock,
            (
                f"{method} {target} HTTP/1.1\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in head.items())
                + "\r\n"
            ).encode("latin-1"),
        )
        async for piece in pieces:
            await loop.sock_sendall(
                sock, b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
            )
            sent += len(piece)
        if chunked:
            await loop.sock_sendall(sock, b"0\r\n\r\n")

    with sock:
        await loop.sock_connect(sock, address)
        sender = asyncio.create_task(send())
        try:
            response = await asyncio.wait_for(_read_response(_SocketReader(sock)), timeout)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender
    response.sent_bytes = sent
    return response


class _SocketReader:
    """Lines and counted bytes from a non-blocking socket, buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._eof = False

    async def _fill(self) -> None:
        data = await asyncio.get_running_loop().sock_recv(self._sock, 1 << 16)
        self._buffer += data
        self._eof = not data

    async def readline(self) -> bytes:
        while (end := self._buffer.find(b"\n")) < 0 and not self._eof:
            await self._fill()
        return self._take(len(self._buffer) if end < 0 else end + 1)

    async def readexactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if self._eof:
                raise ConnectionError(f"the response ended {size - len(self._buffer)} bytes short")
            await self._fill()
        return self._take(size)

    async def read(self) -> bytes:
        """Everything up to the end of the stream."""
        while not self._eof:
            await self._fill()
        return self._take(len(self._buffer))

    def _take(self, size: int) -> bytes:
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        return taken


async def _aiter(pieces: list[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def _read_response(reader: _SocketReader) -> HttpResponse:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection without a response")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while size := int((await reader.readline()).split(b";")[0], 16):
            body += await reader.readexactly(size)
            await reader.readline()
        await reader.readline()
        return HttpResponse(status, headers, bytes(body))
    if "content-length" in headers:
        return HttpResponse(
            status, headers, await reader.readexactly(int(headers["content-length"]))
        )
    return HttpResponse(status, headers, await reader.read())


async def upload(
    base: str,
    data: bytes,
    filename: str = "audio.bin",
    *,
    params: dict[str, str] | None = None,
    chunked: bool = False,
    timeout: float = 300.0,
    fields: dict[str, str] | None = None,
) -> HttpResponse:
    """POST a file to /v1/transcriptions, with `fields` as form fields before it."""
    content_type, pieces = multipart(data, filename, **(fields or {}))
    return await post_form(
        base, content_type, pieces, params=params, chunked=chunked, timeout=timeout
    )


async def post_form(
    base: str,
    content_type: str,
    pieces: Iterable[bytes] | AsyncIterator[bytes],
    *,
    params: dict[str, str] | None = None,
    chunked: bool = False,
    timeout: float = 300.0,
) -> HttpResponse:
    return await request(
        "POST",
        f"{base}/v1/transcriptions",
        body=pieces,
        headers={"Content-Type": content_type},
        chunked=chunked,
        params=params,
        timeout=timeout,
    )


async def get(url: str, timeout: float = 30.0) -> HttpResponse:
    return await request("GET", url, timeout=timeout)
