"""Receive a multipart/form-data upload as it streams: the file part to disk, counted.

Starlette's `request.form()` spools file parts to disk but puts no bound on their size,
so this module drives python-multipart's streaming parser over `request.stream()`
itself. Every byte is counted as it arrives — the request's Content-Length is never
trusted — and the upload is refused (413) the moment the file part passes its limit.
At most about 1 MiB of file data sits in memory before it is written out, and disk
writes run off the event loop.

`FormReceiver` is the sans-I/O core: bytes in, file data out, fields collected; it is
tested without a server. `receive_form()` feeds it from a stream and writes to a file,
and refuses (408) a body that stalls or takes too long, so a slow client cannot hold an
upload slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from server.uploads.decode_worker import Refusal

FILE_FIELD = "file"
MAX_FIELD_BYTES = 1024  # a text field's value
MAX_HEADER_BYTES = 8 << 10  # a part's headers, names and values together
MAX_PARTS = 16
FORM_OVERHEAD = 64 << 10  # body bytes allowed beyond the file: boundaries, headers, fields
FLUSH_BYTES = 1 << 20  # file data buffered before a write


def _bad(message: str) -> Refusal:
    return Refusal(400, "bad_request", message)


def too_large(limit: int) -> Refusal:
    return Refusal(413, "upload_too_large", f"the file is larger than the limit of {limit} bytes")


@dataclass
class _Part:
    headers: dict[str, str] = field(default_factory=dict)
    name: str = ""
    is_file: bool = False
    value: bytearray = field(default_factory=bytearray)


class FormReceiver:
    """Parse a multipart/form-data body fed in chunks of any size.

    `feed()` returns the file part's bytes found in that chunk (for the caller to write)
    and raises Refusal on a malformed body (400), an unknown or oversized field
    (400), or a file past `max_file_bytes` (413).
    """

    def __init__(self, content_type: str, max_file_bytes: int, fields: Collection[str]) -> None:
        media_type, params = parse_options_header(content_type)
        if media_type != b"multipart/form-data" or b"boundary" not in params:
            raise _bad("send the file as multipart/form-data with a `file` part")
        self.max_file_bytes = max_file_bytes
        self.allowed_fields = frozenset(fields)
        self.fields: dict[str, str] = {}
        self.filename = ""
        self.file_bytes = 0
        self.body_bytes = 0
        self.file_complete = False
        self._seen_file = False
        self._parts = 0
        self._ended = False
        self._part = _Part()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._header_bytes = 0  # of the current part
        self._out: list[bytes] = []
        try:
            self._parser = MultipartParser(
                params[b"boundary"],
                {
                    "on_part_begin": self._on_part_begin,
                    "on_header_field": self._on_header_field,
                    "on_header_value": self._on_header_value,
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_part_data": self._on_part_data,
                    "on_part_end": self._on_part_end,
                    "on_end": self._on_end,
                },
            )
        except FormParserError as exc:
            raise _bad(f"bad multipart boundary: {exc}") from None

    def feed(self, chunk: bytes) -> list[bytes]:
        self.body_bytes += len(chunk)
        if self.body_bytes > self.max_file_bytes + FORM_OVERHEAD:
            raise too_large(self.max_file_bytes)
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise _bad(f"malformed multipart body: {exc}") from None
        out, self._out = self._out, []
        return out

    def finish(self) -> None:
        """The body has ended: check that it was complete and held a file."""
        try:
            self._parser.finalize()
        except FormParserError as exc:
            raise _bad(f"malformed multipart body: {exc}") from None
        if not self._ended:
            raise _bad("the multipart body ended before its closing boundary")
        if not self.file_complete:
            raise _bad("the form has no `file` part")

    # ------------------------------------------------------------------ callbacks

    def _on_part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise _bad(f"the form has more than {MAX_PARTS} parts")
        self._part = _Part()
        self._header_bytes = 0

    def _count_header(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _bad(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        name = self._header_field.decode("latin-1").strip().lower()
        self._part.headers[name] = self._header_value.decode("latin-1")
        self._header_field.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        disposition, params = parse_options_header(
            self._part.headers.get("content-disposition", "")
        )
        if disposition != b"form-data" or b"name" not in params:
            raise _bad("each part needs `Content-Disposition: form-data; name=...`")
        name = params[b"name"].decode("utf-8", errors="replace")
        self._part.name = name
        if name == FILE_FIELD:
            if self._seen_file:
                raise _bad("send one `file` part per request")
            self._seen_file = True
            self._part.is_file = True
            self.filename = params.get(b"filename", b"").decode("utf-8", errors="replace")
        elif name not in self.allowed_fields:
            known = ", ".join(sorted({FILE_FIELD, *self.allowed_fields}))
            raise _bad(f"unknown form field {name[:64]!r}; known fields: {known}")
        elif name in self.fields:
            raise _bad(f"form field {name!r} given twice")

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        size = end - start
        if self._part.is_file:
            self.file_bytes += size
            if self.file_bytes > self.max_file_bytes:
                raise too_large(self.max_file_bytes)
            self._out.append(bytes(data[start:end]))
            return
        if len(self._part.value) + size > MAX_FIELD_BYTES:
            raise _bad(f"form field {self._part.name!r} is longer than {MAX_FIELD_BYTES} bytes")
        self._part.value += data[start:end]

    def _on_part_end(self) -> None:
        if self._part.is_file:
            self.file_complete = True
            return
        try:
            self.fields[self._part.name] = self._part.value.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"form field {self._part.name!r} is not UTF-8") from None

    def _on_end(self) -> None:
        self._ended = True


@dataclass(frozen=True, slots=True)
class ReceivedForm:
    path: Path  # the file part's bytes
    filename: str
    size: int
    fields: dict[str, str]


def too_slow(message: str) -> Refusal:
    return Refusal(408, "upload_timeout", message)


async def _chunks(
    stream: AsyncIterator[bytes], idle_timeout_s: float, receive_timeout_s: float
) -> AsyncGenerator[bytes, None]:
    """The body's chunks; Refusal (408) after `idle_timeout_s` without a byte or
    `receive_timeout_s` in all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + receive_timeout_s
    iterator = aiter(stream)
    while True:
        idle = min(idle_timeout_s, deadline - loop.time())
        try:
            async with asyncio.timeout(max(0.0, idle)):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if loop.time() >= deadline:
                raise too_slow(f"the upload took longer than {receive_timeout_s:g} s") from None
            raise too_slow(f"the upload sent nothing for {idle_timeout_s:g} s") from None
        yield chunk


async def receive_form(
    stream: AsyncIterator[bytes],
    content_type: str,
    path: Path,
    *,
    max_file_bytes: int,
    fields: Collection[str],
    idle_timeout_s: float = 30.0,
    receive_timeout_s: float = 3600.0,
) -> ReceivedForm:
    """Stream the body's `file` part into `path`; return it with the text fields."""
    receiver = FormReceiver(content_type, max_file_bytes, fields)
    pending: list[bytes] = []
    buffered = 0
    chunks = _chunks(stream, idle_timeout_s, receive_timeout_s)
    with path.open("wb") as out:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                for piece in receiver.feed(chunk):
                    pending.append(piece)
                    buffered += len(piece)
                if buffered >= FLUSH_BYTES:
                    await asyncio.to_thread(_write, out, pending)
                    pending, buffered = [], 0
        receiver.finish()
        if pending:
            await asyncio.to_thread(_write, out, pending)
    return ReceivedForm(path, receiver.filename, receiver.file_bytes, receiver.fields)


def _write(out: BinaryIO, pieces: list[bytes]) -> None:
    out.writelines(pieces)
