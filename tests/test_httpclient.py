"""The upload tests' HTTP client hears a server that answers early and resets."""

from __future__ import annotations

import socket
import threading

from tests.support.httpclient import endless_file, post_form

REFUSAL = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"


def refusing_server() -> tuple[int, threading.Thread]:
    """A server that reads 64 KiB of a request, answers 413 and closes with the rest of
    the upload unread: the kernel resets the connection, as it does under uvicorn when a
    limit stops an upload."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with listener, listener.accept()[0] as connection:
            connection.recv(64 << 10)
            connection.sendall(REFUSAL)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


async def test_an_early_answer_is_read_though_the_upload_is_reset() -> None:
    """The 413 comes back, not the reset the sender met (asyncio's stream transport
    dropped the answer it had read when a write failed: a CI failure, 12-04)."""
    for _ in range(20):
        port, thread = refusing_server()
        content_type, body = endless_file(64 << 20)
        response = await post_form(f"http://127.0.0.1:{port}", content_type, body, chunked=True)
        thread.join(5)
        assert response.status == 413 and response.body == b"{}"
        assert response.sent_bytes < 64 << 20
