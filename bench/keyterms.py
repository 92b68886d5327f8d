"""Keyterms: how many names, products and jargon words come out right with and without them.

    python -m bench.keyterms                       # both sets, every mechanism
    python -m bench.keyterms --grid                # tune the bonuses on the tuning set

Needs espeak-ng and sox (`apt-get install -y espeak-ng sox`). Two sets of sentences, each
sentence carrying three terms (people's names, product names, jargon), are spoken by
espeak-ng in three voices and resampled to 16 kHz: the TUNING set chose the mechanism and
its bonuses, the HELD_OUT set was only measured. Each clip is transcribed (the recognizer
directly, batch 1, finals' settings) with no keyterms, with its own sentence's set's
terms (recall: terms written right, case and punctuation aside), and with the other
set's terms (terms written that were not said: insertions). The corpus's English clips
(JFK, LibriSpeech, LJ Speech) are transcribed without keyterms and with three unrelated
ones: WER against their references, and the words the terms added. Cost: the mean model
time per final with and without keyterms.

Mechanisms: `prompt` (the terms in Whisper's previous-text prompt), `boost` (logit
bonuses along the terms' token prefix tree, `engine.whisper.keyterms`), `both`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.corpus import clips, read_wav
from engine.api import AudioArray, Utterance
from engine.loading import load_recognizer
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from loadgen.wer import error_counts, normalize
from server.settings import ModelSettings

TUNING: list[tuple[str, tuple[str, ...]]] = [
    (
        "Please ask Siobhan Nakamura to review the Kubernetes migration before Friday.",
        ("Siobhan", "Nakamura", "Kubernetes"),
    ),
    (
        "The Zephyrix dashboard shows that Grafana alerts fired for the PostgreSQL cluster.",
        ("Zephyrix", "Grafana", "PostgreSQL"),
    ),
    (
        "Dmitri Okonkwo said the Quillbot integration needs a new OAuth token.",
        ("Dmitri Okonkwo", "Quillbot", "OAuth"),
    ),
    (
        "We moved the Terraform modules into the Vantiq repository for Priyanka.",
        ("Terraform", "Vantiq", "Priyanka"),
    ),
]
HELD_OUT: list[tuple[str, tuple[str, ...]]] = [
    (
        "Tell Xiaoling Fernandes that the Nginx config broke the Kafka consumers.",
        ("Xiaoling Fernandes", "Nginx", "Kafka"),
    ),
    (
        "The Brightwave roadmap puts Anaplan ahead of the Datadog rollout.",
        ("Brightwave", "Anaplan", "Datadog"),
    ),
    (
        "Oyelaran and Gudmundsdottir will demo Tensorflux on Thursday.",
        ("Oyelaran", "Gudmundsdottir", "Tensorflux"),
    ),
    (
        "Our kubectl scripts now call the Databricks API through Istio.",
        ("kubectl", "Databricks", "Istio"),
    ),
]
VOICES = ("en-us", "en+m3", "en-gb+f2")
UNRELATED = ("Kubernetes", "Siobhan Nakamura", "Zephyrix")
CORPUS = ("en_jfk", "en_ls_1089", "en_ls_61-", "en_ls_1272", "en_lj_LJ001-0001")
MODES = ("none", "prompt", "boost", "both")


@dataclass(frozen=True, slots=True)
class Clip:
    text: str
    terms: tuple[str, ...]
    voice: str
    audio: AudioArray


def speak(text: str, voice: str, folder: Path) -> AudioArray:
    """espeak-ng's `text` in `voice`, as 16 kHz mono float32."""
    raw, wav = folder / "raw.wav", folder / "16k.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(wav)], check=True)
    return read_wav(wav)


def build(
    sentences: Sequence[tuple[str, tuple[str, ...]]], folder: Path, voices: Sequence[str]
) -> list[Clip]:
    return [
        Clip(text, terms, voice, speak(text, voice, folder))
        for text, terms in sentences
        for voice in voices
    ]


def has(hypothesis: str, term: str) -> bool:
    """Whether the normalised `term` occurs in the normalised hypothesis, word for word."""
    words, want = normalize(hypothesis), normalize(term)
    return any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1))


def recognizer(mode: str, start: float, go_on: float) -> WhisperRecognizer:
    boost = mode in ("boost", "both")
    config = WhisperRecognizerConfig(
        keyterm_prompt=mode in ("prompt", "both"),
        keyterm_start=start if boost else 0.0,
        keyterm_continue=go_on if boost else 0.0,
    )
    model = ModelSettings()
    return load_recognizer(model.model, config, cache=Path(model.model_cache))


def run(rec: WhisperRecognizer, audio: AudioArray, terms: Sequence[str]) -> tuple[str, float]:
    started = time.perf_counter()
    [result] = rec.transcribe([Utterance(audio, keyterms=tuple(terms))])
    return result.text, time.perf_counter() - started


@dataclass
class Row:
    right: int = 0
    total: int = 0
    inserted: int = 0
    seconds: list[float] = dataclasses.field(default_factory=list)


def measure(
    rec: WhisperRecognizer, clips_: list[Clip], others: tuple[str, ...], show: bool
) -> tuple[Row, Row]:
    """Recall with the clips' own terms, and insertions with `others` (not said)."""
    own, wrong = Row(), Row()
    for clip in clips_:
        text, seconds = run(rec, clip.audio, clip.terms)
        own.seconds.append(seconds)
        own.total += len(clip.terms)
        own.right += sum(has(text, term) for term in clip.terms)
        if show:
            print(f"    {clip.voice:9} {text}")
        text, seconds = run(rec, clip.audio, others)
        wrong.seconds.append(seconds)
        wrong.inserted += sum(has(text, term) for term in others)
    return own, wrong


def corpus_check(rec: WhisperRecognizer, terms: Sequence[str]) -> tuple[float, int, float]:
    """WER over the corpus clips with `terms`, the terms' words in the output not in the
    references, mean seconds per clip."""
    errors = length = added = 0
    seconds: list[float] = []
    for clip in clips(CORPUS):
        if clip.language != "en":
            continue
        text, took = run(rec, clip.audio(), terms)
        seconds.append(took)
        counts = error_counts(clip.reference, text)
        errors += counts.substitutions + counts.deletions + counts.insertions
        length += counts.reference_length
        said = set(normalize(clip.reference))
        added += sum(w not in said for t in terms for w in normalize(t) if w in normalize(text))
    return errors / length, added, statistics.mean(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--start", type=float, default=None, help="start bonus (default: engine's)")
    parser.add_argument("--go-on", type=float, default=None, help="continue bonus")
    parser.add_argument("--grid", action="store_true", help="tune the bonuses (tuning set)")
    parser.add_argument("--show", action="store_true", help="print every transcript")
    parser.add_argument("--voices", nargs="+", default=list(VOICES), help="espeak-ng voices")
    args = parser.parse_args()
    from engine.whisper import keyterms

    start = keyterms.START if args.start is None else args.start  # the boost modes' bonuses
    go_on = keyterms.CONTINUE if args.go_on is None else args.go_on
    with tempfile.TemporaryDirectory() as folder:
        tuning = build(TUNING, Path(folder), args.voices)
        held_out = build(HELD_OUT, Path(folder), args.voices)
    tuning_terms = tuple(t for _, terms in TUNING for t in terms)[:3]
    held_terms = tuple(t for _, terms in HELD_OUT for t in terms)[:3]
    if args.grid:
        for s in (0.0, 1.0, 2.0, 3.0, 4.0):
            for g in (2.0, 4.0, 6.0):
                rec = recognizer("boost", s, g)
                own, wrong = measure(rec, tuning, held_terms, False)
                wer, added, _ = corpus_check(rec, UNRELATED)
                print(
                    f"start {s:3.1f} continue {g:3.1f}: {own.right}/{own.total} right, "
                    f"{wrong.inserted} inserted, corpus WER {wer:.3f} (+{added} words)"
                )
        return
    print(f"bonuses: start {start}, continue {go_on}; voices {' '.join(args.voices)}")
    for mode in args.modes:
        rec = recognizer(mode, start, go_on)
        for name, set_, others in (
            ("tuning", tuning, held_terms),
            ("held-out", held_out, tuning_terms),
        ):
            own, wrong = measure(rec, set_, () if mode == "none" else others, args.show)
            print(
                f"{mode:6} {name:8}: {own.right:2}/{own.total} terms right, "
                f"{wrong.inserted} unrelated terms inserted; "
                f"{1000 * statistics.mean(own.seconds):.0f} ms per final"
            )
        terms = () if mode == "none" else UNRELATED
        wer, added, seconds = corpus_check(rec, terms)
        jfk = clips(["en_jfk"])[0]
        text, _ = run(rec, jfk.audio(), terms)
        jfk_counts = error_counts(jfk.reference, text)
        jfk_wer = (
            jfk_counts.substitutions + jfk_counts.deletions + jfk_counts.insertions
        ) / jfk_counts.reference_length
        print(
            f"{mode:6} corpus  : WER {wer:.3f} with {len(terms)} unrelated terms "
            f"(+{added} of their words), JFK WER {jfk_wer:.3f}; "
            f"{1000 * seconds:.0f} ms per final"
        )


if __name__ == "__main__":
    main()
