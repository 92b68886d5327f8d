"""Unit tests for the text normaliser and the error-rate alignment."""

from bench.file_wer import differences
from loadgen.wer import (
    ErrorCounts,
    error_counts,
    error_rate,
    normalize,
    number_to_words,
    ordinal_words,
)


def test_normalize_folds_case_punctuation_abbreviations_and_numbers() -> None:
    """Case, punctuation, 'Mr.' and digits normalise to the spoken words."""
    assert normalize("Mr. Quilter, go forward 10 meters!") == [
        "mister",
        "quilter",
        "go",
        "forward",
        "ten",
        "meters",
    ]
    assert normalize('the "forty-two line Bible" of about 1455') == [
        "the",
        "forty",
        "two",
        "line",
        "bible",
        "of",
        "about",
        "fourteen",
        "fifty",
        "five",
    ]
    assert normalize("don't") == ["don't"]


def test_ordinals_and_hesitations() -> None:
    """'15th' is 'fifteenth' (the corpus writes one, the model the other); hesitations,
    which Whisper does not write, are dropped on both sides, as Whisper's normaliser does."""
    assert normalize("the 15th century") == normalize("the fifteenth century")
    assert normalize("in the 21st, 2nd and 3rd rows") == [
        "in",
        "the",
        "twenty",
        "first",
        "second",
        "and",
        "third",
        "rows",
    ]
    assert [ordinal_words(n) for n in (1, 8, 12, 20, 40, 100, 1003)] == [
        "first",
        "eighth",
        "twelfth",
        "twentieth",
        "fortieth",
        "one hundredth",
        "one thousand third",
    ]
    assert normalize("forced uh um, uh hm... Hmm mm-hmm forced aligner") == normalize(
        "Forced forced aligner"
    )
    assert normalize("the 4th-floor") == ["the", "fourth", "floor"]
    assert error_counts("it is the fifteenth", "It is the 15th.").errors == 0


def test_number_to_words() -> None:
    """Cardinals spell out across scales."""
    assert number_to_words(0) == "zero"
    assert number_to_words(1000) == "one thousand"
    assert number_to_words(2024) == "two thousand twenty four"
    assert number_to_words(1_000_017) == "one million seventeen"


def test_error_counts_known_alignment() -> None:
    """One substitution, one deletion and one insertion are counted as such."""
    counts = error_counts("the cat sat on the mat", "the bat sat the mat down")
    assert counts == ErrorCounts(substitutions=1, deletions=1, insertions=1, reference_length=6)
    assert counts.rate == 0.5


def test_error_rate_identity_and_empty() -> None:
    """Equal texts score 0; an empty hypothesis scores 1; empty both scores 0."""
    assert error_rate("And so, my fellow Americans", "and so my fellow americans") == 0.0
    assert error_rate("hello world", "") == 1.0
    assert error_rate("", "") == 0.0


def test_character_error_rate_for_cjk() -> None:
    """zh/ja/ko are scored per character, ignoring punctuation."""
    assert error_rate("换一首歌", "换一首歌。", language="zh") == 0.0
    assert error_rate("换一首歌", "换一首", language="zh") == 0.25


def test_counts_add() -> None:
    """Counts over several utterances sum before the rate is taken."""
    total = error_counts("a b", "a c") + error_counts("d e f", "d e f")
    assert total.rate == 1 / 5


def test_file_wer_lists_the_words_a_transcript_got_wrong() -> None:
    """bench.file_wer --errors: the normalised stretches that differ, nothing for a match."""
    assert differences("It is the 15th century.", "it is the fifteenth century") == []
    assert differences("Hester Prynne, said he", "has to print said he") == [
        ("hester prynne", "has to print")
    ]
    assert differences("a dark suit", "a suit") == [("dark", "")]
