"""Deepgram's `multichannel=true`: one `/v1/listen` socket, one codec per channel.

server/sockets/channels.py serves each channel as a stream of its own and tags its messages with
`"channel": c`; `DeepgramChannels` hands each to that channel's `DeepgramCodec` (built with
`channel=c`: its `Results`, `SpeechStarted` and `UtteranceEnd` say `[c, N]`, and it keeps
its own finalizes, VAD stops and speakers). From the client, audio passes through (the
group splits it) and counts in channel 0's `sha256`; every control reaches every codec,
and channel 0's answers (`ConfigureSuccess`) speak for the stream. The closing `Metadata`
comes once, after every channel's last final.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.compat.bridge import Inbound, Message
from server.compat.deepgram import DeepgramCodec


class DeepgramChannels:
    """The codec of a multichannel `/v1/listen` stream (server.compat.bridge.Codec)."""

    def __init__(self, codecs: Sequence[DeepgramCodec]) -> None:
        self._codecs = list(codecs)
        self._metadata: str | None = None  # channel 0's, sent once every channel ended
        self._ended: set[int] = set()

    def from_client(self, message: Message) -> Inbound:
        first = self._codecs[0].from_client(message)
        if message.get("bytes") is None:  # a control: each channel counts its Finalize
            for codec in self._codecs[1:]:
                codec.from_client(message)
        return first

    def from_server(self, message: Message) -> list[str]:
        channel = int(message.pop("channel", 0))
        out = self._codecs[channel].from_server(message)
        if message["type"] != "session.ended":
            return out
        *out, metadata = out
        if channel == 0:
            self._metadata = metadata
        self._ended.add(channel)
        if len(self._ended) == len(self._codecs) and self._metadata is not None:
            out.append(self._metadata)
        return out
