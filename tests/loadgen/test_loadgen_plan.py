"""Room scripts from the corpus, audio decoding, and the room-count search (no server)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import av
import numpy as np
import pytest
from av.audio.stream import AudioStream

from loadgen.audio import AudioDecodeError, load_audio
from loadgen.corpus import (
    Clip,
    ScriptShape,
    default_corpus_dir,
    load_manifest,
    plan_room,
    select_clips,
)
from loadgen.search import RoomSearch
from tests.support.loadgen_checks import to_flac

SR = 16_000


def fake_clips(*seconds: float) -> tuple[list[Clip], dict[str, np.ndarray]]:
    clips = [
        Clip(f"c{i}", "en", s, f"words {i}", Path(f"/nowhere/c{i}.wav"))
        for i, s in enumerate(seconds)
    ]
    audio = {c.id: np.full(round(c.duration_s * SR), i + 1, np.int16) for i, c in enumerate(clips)}
    return clips, audio


def test_plan_room_turns_gaps_and_spans() -> None:
    """Clips cycle from the room's offset, speakers alternate, gaps are 1-2 s, spans match audio."""
    clips, audio = fake_clips(2.0, 3.0, 1.0)
    shape = ScriptShape(duration_s=12.0)
    room = plan_room("m", ["a", "b"], clips, audio, shape, random.Random(1), first_clip=1)
    ids = [u.clip_id for u in room.utterances]
    assert ids[:4] == ["c1", "c2", "c0", "c1"][: len(ids)]
    assert [u.participant for u in room.utterances] == ["a", "b", "a", "b", "a"][: len(ids)]
    assert room.utterances[0].start == shape.lead_in_s
    assert room.utterances[-1].end <= shape.duration_s
    for before, after in zip(room.utterances, room.utterances[1:], strict=False):
        assert 1.0 <= after.start - before.end <= 2.0
    lengths = {len(np.concatenate(t.pieces)) for t in room.tracks.values()}
    assert len(lengths) == 1  # every participant streams the whole timeline
    assert room.audio_seconds == pytest.approx(room.utterances[-1].end + shape.tail_s)
    for name, track in room.tracks.items():
        samples = np.concatenate(track.pieces)
        voiced = np.flatnonzero(samples)
        mine = [u for u in room.utterances if u.participant == name]
        assert len(voiced) == sum(round((u.end - u.start) * SR) for u in mine)
        for u in mine:
            span = samples[round(u.start * SR) : round(u.end * SR)]
            assert np.all(span == int(u.clip_id[1]) + 1)


def test_plan_room_skips_a_clip_too_long_for_the_rest() -> None:
    """Near the end, a clip that would overrun is passed over for a later one that fits."""
    clips, audio = fake_clips(1.0, 5.0, 1.0)
    room = plan_room("m", ["a"], clips, audio, ScriptShape(duration_s=6.0), random.Random(0))
    assert [u.clip_id for u in room.utterances] == ["c0", "c2"]


def test_plan_room_places_one_clip_even_when_too_long() -> None:
    """A duration shorter than the first clip still plays that clip."""
    clips, audio = fake_clips(5.0)
    room = plan_room("m", ["a"], clips, audio, ScriptShape(duration_s=1.0), random.Random(0))
    assert len(room.utterances) == 1


def test_corpus_manifest_and_selection() -> None:
    """The shared corpus loads; English clips up to 30 s leave the long-form file out."""
    clips = load_manifest(default_corpus_dir())
    english = select_clips(clips, "en", 30.0)
    assert english and all(c.language == "en" and c.duration_s <= 30 for c in english)
    assert len(english) < sum(1 for c in clips if c.language == "en")
    with pytest.raises(ValueError):
        select_clips(clips, "xx", 30.0)


def encode(path: Path, samples: np.ndarray, rate: int, codec: str) -> None:
    """Write mono float32 `samples` as stereo with PyAV (planar float in, resampled as needed)."""
    with av.open(str(path), "w") as container:
        stream = cast(AudioStream, container.add_stream(codec, rate=rate, layout="stereo"))
        for i in range(0, len(samples), 1024):
            chunk = np.tile(samples[i : i + 1024], (2, 1)).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="stereo")
            frame.sample_rate = rate
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


@pytest.mark.parametrize(
    ("suffix", "codec", "rate"),
    [(".mp3", "mp3", 44_100), (".ogg", "libopus", 48_000), (".m4a", "aac", 44_100)],
)
def test_compressed_stereo_decodes_to_16k_mono(
    tmp_path: Path, suffix: str, codec: str, rate: int
) -> None:
    """Stereo mp3/ogg/m4a at 44.1-48 kHz decode to 16 kHz mono of the same length (±0.1 s)."""
    t = np.arange(rate * 2) / rate
    path = tmp_path / f"tone{suffix}"
    encode(path, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, codec)
    samples = load_audio(path)
    assert samples.dtype == np.int16
    assert abs(len(samples) - 2 * SR) < 0.1 * SR
    assert np.abs(samples).max() > 3000


def test_wav_fast_path_matches_av(tmp_path: Path) -> None:
    """A 16 kHz mono WAV reads the same through the fast path and through PyAV."""
    wav = default_corpus_dir() / "wav" / "en_jfk.wav"
    fast = load_audio(wav)
    flac = to_flac(wav, tmp_path / "jfk.flac")
    assert np.array_equal(load_audio(flac), fast)
    assert len(fast) == 11 * SR


def test_undecodable_files_raise(tmp_path: Path) -> None:
    """A missing file or garbage raises AudioDecodeError."""
    with pytest.raises(AudioDecodeError):
        load_audio(tmp_path / "missing.wav")
    junk = tmp_path / "junk.mp3"
    junk.write_bytes(b"not audio at all" * 10)
    with pytest.raises(AudioDecodeError):
        load_audio(junk)


def run_search(capacity: int, max_rooms: int = 256, start: int = 1) -> RoomSearch:
    search = RoomSearch(start=start, max_rooms=max_rooms, precision=0.0)
    for _ in range(40):
        rooms = search.next_rooms()
        if rooms is None:
            return search
        search.record(rooms, rooms <= capacity)
    raise AssertionError("the search did not end")


@pytest.mark.parametrize("capacity", [0, 1, 2, 7, 33, 100, 255])
def test_search_finds_capacity_exactly(capacity: int) -> None:
    """Doubling then bisecting lands on the capacity, in at most 2·log2(max) trials."""
    search = run_search(capacity)
    assert search.best == capacity
    assert len(search.steps) <= 16


def test_search_stops_at_max_rooms() -> None:
    """A server that never fails stops the search at max_rooms."""
    search = run_search(10_000, max_rooms=20)
    assert search.best == 20 and [r for r, _ in search.steps] == [1, 2, 4, 8, 16, 20]


def test_search_precision_stops_early() -> None:
    """With 5 % precision the last bisection steps are skipped."""
    search = RoomSearch(max_rooms=1024, precision=0.05)
    while (rooms := search.next_rooms()) is not None:
        search.record(rooms, rooms <= 500)
    assert 500 * 0.95 <= search.best <= 500
