"""The decoder subprocess: one untrusted upload in, 16 kHz mono pcm_s16le out.

server/uploads/decode.py runs this file as `python -I server/uploads/decode_worker.py ...`,
never inside the server process: a hostile file that crashes, hangs or balloons FFmpeg takes down
only this process. Before it touches the input the worker lowers its own limits
(RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE on the output, no core dumps) and its priority
(nice 10, so live rooms keep the CPU); the parent adds the wall-clock limit.

What it accepts, through PyAV (FFmpeg), never hand-written parsing:
- containers (demuxers) on a whitelist: wav, mp3, mp4/m4a/mov, flac, ogg. FFmpeg
  enforces it (`format_whitelist`) before any demuxer reads the file, so playlists
  (hls, concat/ffconcat), images and everything else are refused unread. FFmpeg reads
  the upload through an open file object and may open no protocol at all, so nothing
  can reach the network or another file.
- audio codecs on a whitelist (PCM, MP3, AAC, ALAC, FLAC, Opus, Vorbis);
- a decoded duration up to `--max-seconds`: refused at once when the container
  declares more (where that figure is exact), and counted while decoding otherwise.

It writes one JSON object on stdout: `{"ok": true, ...facts...}`, or
`{"ok": false, "status": 415|422, "code": ..., "message": ...}` and exits 3. The
module is self-contained (stdlib and PyAV) so it can run isolated (`-I`); the parent
imports it only for its constants.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from typing import Any, NoReturn

OUTPUT_RATE = 16_000
OUTPUT_BYTES_PER_SECOND = OUTPUT_RATE * 2  # mono s16le

# FFmpeg demuxer names. The mp4 family is one demuxer with one name list.
ACCEPTED_FORMATS = ("wav", "mp3", "mov", "mp4", "m4a", "3gp", "3g2", "mj2", "flac", "ogg")
ACCEPTED_CODECS = frozenset(
    {
        "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_u8", "pcm_f32le", "pcm_f64le",
        "pcm_s16be", "pcm_s24be", "pcm_s32be", "pcm_f32be", "pcm_alaw", "pcm_mulaw",
        "mp3", "mp3float", "aac", "alac", "flac", "opus", "libopus", "vorbis",
    }
)  # fmt: skip
# FFmpeg says so when a duration is only estimated from the bitrate (an MP3 without a
# Xing header, a WAV whose size field is unset). Other declared durations are exact
# (header counts): a file that declares more than the cap is refused before decoding, and
# one that decodes to clearly less was cut short. Estimated durations are only counted.
ESTIMATED_DURATION_LOG = ("Estimating duration from bitrate", "using bitrate for duration")
# File signatures of the accepted containers: an unreadable file that starts like one is
# damaged (422); one that does not is simply not a format we take (415).
SIGNATURES: tuple[tuple[int, bytes], ...] = (
    (0, b"RIFF"), (0, b"RF64"), (0, b"ID3"), (0, b"fLaC"), (0, b"OggS"), (4, b"ftyp"),
)  # fmt: skip
# A file at 1 Hz that declares nothing decodes to 16 000 output samples per input sample:
# no speech is recorded below telephone quality, so such rates are refused outright.
MIN_SOURCE_RATE = 8_000
MAX_SOURCE_RATE = 384_000
MAX_BAD_PACKETS = 10  # corrupt or undecodable packets skipped before the file is refused
MAX_BAD_FRACTION = 0.01
TRUNCATION_TOLERANCE = 0.5  # seconds (plus 2 %) a file may decode short of its header

EXIT_REFUSED = 3


class Refusal(Exception):
    """An upload is refused: `status` is the HTTP status the server answers with, `code`
    and `message` go in its error body. The one such error of the server (the form, the
    decoder, the worker raise it): it lives here because this module must run alone."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _unsupported(message: str) -> Refusal:
    return Refusal(415, "unsupported_format", message)


def _invalid(message: str) -> Refusal:
    return Refusal(422, "invalid_audio", message)


def limit_self(cpu_seconds: int, memory_bytes: int, output_bytes: int) -> None:
    """Lower this process's own limits and priority; they cannot be raised again."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.nice(10)


def _sniff(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(16)
    return any(head[offset : offset + len(magic)] == magic for offset, magic in SIGNATURES)


def _ffmpeg_said(logs: list[Any]) -> str:
    """The last FFmpeg error line, for the refusal's reason."""
    for level, _name, message in reversed(logs):
        if level <= 16:  # AV_LOG_ERROR
            return str(message).strip()
    return ""


def _not_whitelisted(logs: list[Any]) -> str | None:
    """The demuxer FFmpeg detected, when it refused it as not on the whitelist."""
    for _level, name, message in logs:
        if "not on whitelist" in str(message):
            return str(name)
    return None


def decode(src: str, dst: str, max_seconds: float) -> dict[str, Any]:
    """Decode `src` into raw 16 kHz mono s16le at `dst`; return the facts, or raise Refusal."""
    import av
    import av.logging

    av.logging.set_level(av.logging.WARNING)
    options = {
        "format_whitelist": ",".join(ACCEPTED_FORMATS),
        # FFmpeg reads the upload through the open file handed to it, so no protocol is
        # needed: any nested open (a playlist entry, a reference, a URL) is refused.
        "protocol_whitelist": "none",
        "codec_whitelist": ",".join(sorted(ACCEPTED_CODECS)),
    }
    with av.logging.Capture() as logs, open(src, "rb") as upload:
        try:
            container = av.open(upload, options=options)
        except av.error.ArgumentError as exc:
            detected = _not_whitelisted(logs)
            if detected is None:
                raise _invalid(f"could not open the file: {exc.strerror}") from None
            raise _unsupported(
                f"{detected!r} files are not accepted; send wav, mp3, m4a/mp4, flac or ogg"
            ) from None
        except av.error.FFmpegError as exc:
            if _sniff(src):
                reason = _ffmpeg_said(logs) or exc.strerror
                raise _invalid(f"the file is damaged or truncated: {reason}") from None
            raise _unsupported(
                "not a recognised audio file; send wav, mp3, m4a/mp4, flac or ogg"
            ) from None
        with container:
            return _decode_container(container, dst, max_seconds, logs)


def _decode_container(
    container: Any, dst: str, max_seconds: float, logs: list[Any]
) -> dict[str, Any]:
    import av

    fmt = container.format.name
    if not set(fmt.split(",")) & set(ACCEPTED_FORMATS):  # FFmpeg enforced it; belt and braces
        raise _unsupported(f"{fmt!r} files are not accepted")
    if not container.streams.audio:
        raise _invalid("the file has no audio stream")
    stream = container.streams.audio[0]
    codec = stream.codec_context.name
    if codec not in ACCEPTED_CODECS:
        raise _unsupported(f"audio codec {codec!r} is not accepted")
    stream.codec_context.thread_count = 1
    declared = _declared_seconds(container, stream)
    estimated = any(m in str(line[2]) for line in logs for m in ESTIMATED_DURATION_LOG)
    exact = None if estimated else declared  # a declared duration we may hold the file to
    if exact is not None and exact > max_seconds:
        raise Refusal(
            422,
            "audio_too_long",
            f"the file declares {exact:.0f} s of audio; the limit is {max_seconds:.0f} s",
        )
    rate = stream.codec_context.sample_rate or 0
    if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
        raise _invalid(
            f"a sample rate of {rate} Hz is not speech audio "
            f"({MIN_SOURCE_RATE}-{MAX_SOURCE_RATE} Hz accepted)"
        )
    resampler = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
    shape: tuple[str, str, int] | None = None  # the input the resampler was set up for
    source_seconds = 0.0
    samples = packets = bad = 0
    last_bad = False
    first_error = ""
    with open(dst, "wb", buffering=1 << 20) as out:

        def write(frames: list[Any]) -> None:
            nonlocal samples
            for frame in frames:
                out.write(bytes(frame.planes[0])[: frame.samples * 2])
                samples += frame.samples

        for packet in container.demux(stream):
            flushing = packet.size == 0
            if not flushing:
                packets += 1
            try:
                if packet.is_corrupt:
                    raise av.error.InvalidDataError(1094995529, "packet is corrupt")
                frames = packet.decode()
            except av.error.InvalidDataError as exc:
                bad += 1
                last_bad = True
                first_error = first_error or _ffmpeg_said(logs) or str(exc.strerror)
                if packets >= 1000 and _too_many_bad(bad, packets):  # mostly garbage: stop now
                    message = f"{bad} of the first {packets} audio packets are damaged"
                    raise _invalid(message) from None
                continue
            last_bad = last_bad and flushing
            for frame in frames:
                source_seconds += frame.samples / frame.sample_rate
                if source_seconds > max_seconds:
                    raise Refusal(
                        422,
                        "audio_too_long",
                        f"the file decodes to more than {max_seconds:.0f} s of audio",
                    )
                frame_shape = (frame.format.name, frame.layout.name, frame.sample_rate)
                if shape is not None and frame_shape != shape:
                    # The stream changed rate or layout midway (chained or damaged
                    # files): drain the resampler and start a fresh one.
                    write(resampler.resample(None))
                    resampler = av.AudioResampler(format="s16", layout="mono", rate=OUTPUT_RATE)
                shape = frame_shape
                write(resampler.resample(frame))
        write(resampler.resample(None))
    seconds = samples / OUTPUT_RATE
    if _too_many_bad(bad, packets):
        raise _invalid(f"{bad} of {packets} audio packets are damaged ({first_error})")
    if last_bad:
        raise _invalid(
            f"the file is truncated: it breaks off after {source_seconds:.1f} s ({first_error})"
        )
    if samples == 0:
        raise _invalid("the file holds no decodable audio")
    if exact is not None and seconds < exact * 0.98 - TRUNCATION_TOLERANCE:
        raise _invalid(
            f"the file is truncated: it declares {exact:.1f} s but holds {seconds:.1f} s"
        )
    return {
        "ok": True,
        "format": fmt,
        "codec": codec,
        "sample_rate": stream.codec_context.sample_rate,
        "channels": stream.codec_context.channels,
        "declared_seconds": declared,
        "source_seconds": round(source_seconds, 3),
        "samples": samples,
        "bad_packets": bad,
    }


def _too_many_bad(bad: int, packets: int) -> bool:
    return bad > max(MAX_BAD_PACKETS, MAX_BAD_FRACTION * packets)


def _declared_seconds(container: Any, stream: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration / 1_000_000)
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("--max-seconds", type=float, required=True)
    parser.add_argument("--cpu-seconds", type=int, required=True)
    parser.add_argument("--memory-bytes", type=int, required=True)
    return parser


def _answer(payload: dict[str, Any], code: int = 0) -> NoReturn:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown: nothing is left to clean up


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    # The output can never be larger than the duration cap allows (plus a margin).
    output_bytes = int((args.max_seconds + 60) * OUTPUT_BYTES_PER_SECOND)
    limit_self(args.cpu_seconds, args.memory_bytes, output_bytes)
    try:
        import av  # noqa: F401 - fails here, not on the file, if the limits leave no room
    except (ImportError, MemoryError) as exc:
        _answer(
            {"ok": False, "status": 500, "code": "internal",
             "message": f"the decoder could not start: {type(exc).__name__}"},
            EXIT_REFUSED,
        )  # fmt: skip
    try:
        facts = decode(args.src, args.dst, args.max_seconds)
    except Refusal as refusal:
        _answer(
            {"ok": False, "status": refusal.status, "code": refusal.code,
             "message": refusal.message},
            EXIT_REFUSED,
        )  # fmt: skip
    except MemoryError:
        _answer(
            {"ok": False, "status": 422, "code": "decode_limit",
             "message": "decoding the file exceeded the decoder's memory limit"},
            EXIT_REFUSED,
        )  # fmt: skip
    except Exception as exc:  # any other FFmpeg failure is the file's: say so, briefly
        _answer(
            {"ok": False, "status": 422, "code": "invalid_audio",
             "message": f"the file could not be decoded: {type(exc).__name__}: {exc}"[:300]},
            EXIT_REFUSED,
        )  # fmt: skip
    _answer(facts)


if __name__ == "__main__":
    main()
