"""The sound-alike rewrite (`engine.whisper.soundalike`): hypothesis words with their
probabilities and keyterms in, words out."""

from __future__ import annotations

from engine.api import WordTiming
from engine.whisper import soundalike


def words(*spec: tuple[str, float]) -> tuple[WordTiming, ...]:
    """Words a second apart, each with its probability."""
    return tuple(WordTiming(w, float(i), i + 0.8, p) for i, (w, p) in enumerate(spec))


def text(out: tuple[WordTiming, ...]) -> str:
    return "".join(w.word for w in out).strip()


HEARD = words(
    (" Review", 0.95),
    (" the", 0.97),
    (" Cuban", 0.31),
    (" eat", 0.22),
    (" migration.", 0.9),
)


def test_an_unsure_sound_alike_span_becomes_the_term() -> None:
    """The unsure "Cuban eat" sounds like Kubernetes: the two words become one, spanning
    both words' times, the trailing punctuation of the span kept."""
    out = soundalike.rewrite(HEARD, ["Kubernetes"])
    assert text(out) == "Review the Kubernetes migration."
    merged = out[2]
    assert merged.word == " Kubernetes"
    assert (merged.start, merged.end) == (2.0, 3.8)
    assert merged.probability == round((0.31 + 0.22) / 2, 4)
    assert out[3] == HEARD[4]


def test_a_confident_sound_alike_is_left() -> None:
    """The same words written with confidence are not replaced."""
    sure = tuple(WordTiming(w.word, w.start, w.end, 0.95) for w in HEARD)
    assert soundalike.rewrite(sure, ["Kubernetes"]) == sure


def test_an_unrelated_unsure_word_is_left() -> None:
    """An unsure span that does not sound like any term is not replaced."""
    assert soundalike.rewrite(HEARD, ["Grafana", "Siobhan Nakamura", "Zephyrix"]) == HEARD


def test_punctuation_and_names_of_several_words() -> None:
    """A term of two words replaces an unsure span, the punctuation after it kept; a term
    already written is not written twice."""
    heard = words((" Ask", 0.9), (" Dimitri", 0.4), (" Okonk-Woe,", 0.2), (" please.", 0.9))
    out = soundalike.rewrite(heard, ["Dmitri Okonkwo"])
    assert text(out) == "Ask Dmitri Okonkwo, please."
    assert soundalike.rewrite(out, ["Dmitri Okonkwo"]) == out


def test_each_term_is_written_once_at_its_closest_span() -> None:
    """Two unsure spans sound like one term: only the closer one becomes it."""
    heard = words((" Graph", 0.3), (" of", 0.9), (" Grafina", 0.2))
    assert text(soundalike.rewrite(heard, ["Grafana"])) == "Graph of Grafana"


def test_short_terms_are_not_matched() -> None:
    """A term whose phonetic key is too short to tell apart (e.g. "Io") is never written."""
    heard = words((" I", 0.2), (" owe", 0.2))
    assert soundalike.rewrite(heard, ["Io"]) == heard


def test_words_from_tokens() -> None:
    """Without timings, words come from tokens: a token with a leading space begins one;
    a word's probability is its tokens' mean."""
    out = soundalike.token_words([" Cub", "an", " eat", "."], [-0.1, -0.5, -1.0, -0.01])
    assert [w.word for w in out] == [" Cuban", " eat."]
    assert abs(out[0].probability - (0.9048 + 0.6065) / 2) < 1e-3


def test_sound_alike_letters_cost_half_an_edit() -> None:
    """In the keys' distance, B for F (or a dropped H) costs half an edit, M for K a whole."""
    assert soundalike.distance("XFN", "XBN") == 0.5
    assert soundalike.distance("XBHN", "XBN") == 0.5
    assert soundalike.distance("KFK", "KNK") == 1.0
    assert soundalike.distance("", "KBRNTS") == 6.0
