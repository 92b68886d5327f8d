"""The streaming multipart parser behind uploads, driven without a server."""

from __future__ import annotations

import pytest

from server.uploads.decode_worker import Refusal
from server.uploads.form import FormReceiver
from tests.support import audiofiles
from tests.support.httpclient import multipart


def parse_form(pieces: list[bytes], content_type: str, limit: int = 1 << 20) -> FormReceiver:
    receiver = FormReceiver(content_type, limit, {"language", "format"})
    body = b"".join(pieces)
    out: list[bytes] = []
    for i in range(0, len(body), 777):
        out += receiver.feed(body[i : i + 777])
    receiver.finish()
    receiver.fields["_file"] = b"".join(out).hex()
    return receiver


def test_form_receiver_streams_the_file_and_collects_fields() -> None:
    """Fields and file bytes come out intact whatever the chunking."""
    data = audiofiles.random_bytes(50_000)
    content_type, pieces = multipart(data, "x.wav", language="fr")
    receiver = parse_form(pieces, content_type)
    assert receiver.fields["language"] == "fr" and receiver.filename == "x.wav"
    assert bytes.fromhex(receiver.fields["_file"]) == data
    assert receiver.file_bytes == len(data)


@pytest.mark.parametrize(
    ("case", "status"),
    [("too big", 413), ("unknown field", 400), ("no file", 400), ("cut short", 400),
     ("not multipart", 400), ("two files", 400)],
)  # fmt: skip
def test_form_receiver_refuses_bad_bodies(case: str, status: int) -> None:
    """Each malformed or oversized body is refused with its status while it streams."""
    data = audiofiles.random_bytes(5_000)
    content_type, pieces = multipart(data, "x.wav", language="en")
    if case == "too big":
        content_type, pieces = multipart(audiofiles.random_bytes(2_000_000), "x.wav")
    elif case == "unknown field":
        content_type, pieces = multipart(data, "x.wav", colour="blue")
    elif case == "no file":
        content_type, pieces = multipart(None, language="en")
    elif case == "cut short":
        pieces = pieces[:-2]
    elif case == "not multipart":
        content_type = "application/octet-stream"
    elif case == "two files":
        boundary = content_type.split("=")[1]
        part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n\r\n'
        ).encode()
        pieces = [part, data, b"\r\n", part, data, b"\r\n", f"--{boundary}--\r\n".encode()]
    with pytest.raises(Refusal) as caught:
        parse_form(pieces, content_type)
    assert caught.value.status == status, caught.value.message


def test_form_receiver_bounds_a_parts_headers() -> None:
    """A part's headers together are capped at 8 KiB (400), whatever the parser's own
    per-line limits: seven 3 KB headers (each within python-multipart's 4 KiB line limit)
    are refused rather than held."""
    head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="x"\r\n'
    pads = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 3000) for i in range(6))
    body = head + pads + b"\r\nRIFF\r\n--b--\r\n"
    receiver = FormReceiver("multipart/form-data; boundary=b", 4 << 20, {"language"})
    with pytest.raises(Refusal) as caught:
        for i in range(0, len(body), 1024):
            receiver.feed(body[i : i + 1024])
        receiver.finish()
    assert caught.value.status == 400 and "headers" in caught.value.message
    assert receiver.body_bytes <= 10 << 10
