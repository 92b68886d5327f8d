"""The text options' sans-I/O core: spoken numbers read as digits, Luhn, redaction,
numerals and profanity masks, on text and on words alike."""

from __future__ import annotations

import pytest

from engine.api import WordTiming
from session.spoken_numbers import Token, find_runs
from session.text_filter import TextFilter, luhn
from wire.errors import ProtocolError
from wire.text_options import Redaction, TextOptions, parse_redact, parse_text_options

PCI_SSN = TextFilter(TextOptions(redact=frozenset({Redaction.PCI, Redaction.SSN})))
NUMBERS = TextFilter(TextOptions(redact=frozenset({Redaction.NUMBERS})))
NUMERALS = TextFilter(TextOptions(numerals=True))
PROFANITY = TextFilter(TextOptions(profanity_filter=True))


def digits(text: str) -> list[str]:
    tokens = [Token.parse(t) for t in text.split()]
    return [run.digits for run in find_runs(tokens)]


def test_luhn() -> None:
    """The Luhn check passes test card numbers and fails them with one digit changed."""
    assert luhn("4111111111111111") and luhn("5500005555555559") and luhn("378282246310005")
    assert not luhn("4111111111111112") and not luhn("4111 1111") and not luhn("")


@pytest.mark.parametrize(
    "spoken",
    [
        "four one one one",
        "4111",
        "forty one eleven",
        "forty-one eleven",
        "four-one-one-one",
        "four one 11",
        "41 eleven",
        "four double one one",
    ],
)
def test_every_shape_of_spoken_digits_reads_the_same(spoken: str) -> None:
    """'four one one one', '4111', 'forty one eleven' and their mixes all say 4111."""
    assert digits(f"the code is {spoken} thanks") == ["4111"]


def test_spoken_numbers_read_as_numbers() -> None:
    """Hundreds, thousands, 'and' inside a number, 'oh' between numbers, ordinals."""
    assert digits("one hundred and five people") == ["105"]
    assert digits("two thousand twenty four") == ["2024"]
    assert digits("nineteen eighty four") == ["1984"]
    assert digits("room four oh one") == ["401"]
    assert digits("the twenty first time") == ["21"]
    assert digits("oh no") == [] and digits("first of all") == []


def test_a_lone_one_is_a_word() -> None:
    """'no one', 'the one', 'one of them' are not numbers; 'page one', 'one percent' are."""
    assert digits("no one came and the one I like is one of them") == []
    assert digits("page one") == ["1"] and digits("one percent") == ["1"]
    assert digits("one two") == ["12"]


@pytest.mark.parametrize(
    "card",
    [
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "four one one one one one one one one one one one one one one one",
        "forty one eleven, eleven eleven, eleven eleven, eleven eleven",
    ],
)
def test_pci_redacts_a_card_number_however_spoken(card: str) -> None:
    """A Luhn-valid card number is one [PCI] in the text, the words around it kept."""
    assert PCI_SSN.text(f"My card is {card}. Thanks.") == "My card is [PCI]. Thanks."


def test_pci_keeps_digits_that_fail_luhn_and_finds_a_card_inside_a_run() -> None:
    """16 digits failing Luhn stay (no card words before them); a card inside a longer
    run takes the run with it (its expiry, as Deepgram's pci does); a card between other
    numbers on word boundaries goes alone."""
    assert PCI_SSN.text("order 4111 1111 1111 1112 ok") == "order 4111 1111 1111 1112 ok"
    assert PCI_SSN.text("pay 4111 1111 1111 1111 12 25 ok") == "pay [PCI] ok"
    assert PCI_SSN.text("pay 7 4111 1111 1111 1111 ok") == "pay 7 [PCI] ok"


def test_what_the_model_makes_of_a_spoken_card_still_goes() -> None:
    """tiny.en's transcripts of espeak's spoken card and SSN (a digit dropped, digits
    repeated, a mangled group): after the card's or the SSN's words, nothing of them
    is left."""
    said = {
        "My current number is 5, 4, 2, 5, 2, 3, 3, 4, 3, 0, 1, 0, 9, 0, 3, thank you.": (
            "My current number is [PCI], thank you."
        ),
        "My current number is 4111, 11, 11, 11, 11, 11, 11, 11, 11, 11, thank you.": (
            "My current number is [PCI], thank you."
        ),
        "My social security number is 123-45-6,700-80-I-N Thank you": (
            "My social security number is [SSN] Thank you"
        ),
        "My social security number is 1,2,3,45, 6,7,8,8,8. Thank you.": (
            "My social security number is [SSN]. Thank you."
        ),
    }
    for text, redacted in said.items():
        assert PCI_SSN.text(text) == redacted


def test_ssn_is_nine_digits_grouped_or_not() -> None:
    """123-45-6789, 123 45 6789 and nine spoken digits are each one [SSN]."""
    for ssn in ("123-45-6789", "123 45 6789", "one two three four five six seven eight nine"):
        assert PCI_SSN.text(f"mine is {ssn} ok") == "mine is [SSN] ok"
    assert PCI_SSN.text("it costs 12345678 ok") == "it costs 12345678 ok"  # 8 digits


def test_numbers_redacts_every_run() -> None:
    """redact=numbers: each run of digits, spoken or written, is one [NUMBER]."""
    assert NUMBERS.text("I have two brothers and 11 sisters.") == (
        "I have [NUMBER] brothers and [NUMBER] sisters."
    )
    assert NUMBERS.text("No one knows.") == "No one knows."


def test_numerals() -> None:
    """Counts, percentages, money, times, ordinals and digit strings written as numerals;
    'no one' and 'the one' stay words."""
    sentence = (
        "I have two brothers and four sisters. There are seven open issues and eleven closed ones."
    )
    assert NUMERALS.text(sentence) == (
        "I have 2 brothers and 4 sisters. There are 7 open issues and 11 closed ones."
    )
    assert NUMERALS.text("It is twenty five percent, costs five dollars, at three thirty pm.") == (
        "It is 25%, costs $5, at 3:30 PM."
    )
    assert NUMERALS.text("The twenty first time, the fourth floor, nineteen eighty four.") == (
        "The 21st time, the 4th floor, 1984."
    )
    assert NUMERALS.text("No one came; the one I like.") == "No one came; the one I like."
    assert NUMERALS.text("wait a second") == "wait a second"
    assert NUMERALS.text("I have a thousand thoughts.") == "I have a thousand thoughts."


def test_profanity_is_masked_letter_for_letter() -> None:
    """A profane word becomes one asterisk per letter, its punctuation kept, as Deepgram
    masks it; innocent words stay."""
    masked = PROFANITY.text("What the fuck, this is shit. Damn!")
    assert masked == "What the ****, this is ****. ****!"
    assert PROFANITY.text("kill the process, thank god") == "kill the process, thank god"


def test_words_are_redacted_as_the_text_is() -> None:
    """A redacted span is one word over the span's time, with its lowest probability; the
    words joined make the redacted text."""
    said = " My card is 4111 1111 1111 1111. Thanks."
    pieces = said.split(" ")[1:]
    words = [
        WordTiming(" " + piece, i * 0.5, i * 0.5 + 0.4, 0.9 - i * 0.01)
        for i, piece in enumerate(pieces)
    ]
    out = PCI_SSN.words(words)
    assert "".join(w.word for w in out).strip() == PCI_SSN.text(said).strip()
    card = next(w for w in out if "[PCI]" in w.word)
    assert card.word == " [PCI]." and (card.start, card.end) == (1.5, 3.4)
    assert card.probability == pytest.approx(0.84)
    assert not any(c.isdigit() for w in out for c in w.word)


def test_a_partial_hides_a_number_still_being_said() -> None:
    """A partial ending in digits (a card's first group, said so far) redacts them with
    pci asked; the final, complete, is judged as it is; digits before other words stay."""
    assert PCI_SSN.text("My card number is 4.", partial=True) == "My card number is [PCI]."
    assert PCI_SSN.text("My card number is 4.") == "My card number is 4."
    assert PCI_SSN.text("I have 2 kids and", partial=True) == "I have 2 kids and"


def test_off_changes_nothing() -> None:
    """Every option off: text and words pass as they are."""
    plain = TextFilter(TextOptions())
    words = (WordTiming(" two", 0.0, 0.2, 0.9),)
    assert plain.text(" I have two.") == " I have two." and plain.words(words) == words


def test_options_parse_as_deepgram_names_them() -> None:
    """redact repeats or takes commas, true is numbers, smart_format is numerals; a
    redaction Parley cannot do (pii) is refused rather than ignored."""
    assert parse_redact(["pci", "ssn,numbers"]) == set(Redaction)
    assert parse_redact(["true"]) == {Redaction.NUMBERS} and parse_redact(["false"]) == set()
    options = parse_text_options([], smart_format="true", profanity_filter="false")
    assert options.numerals and not options.profanity_filter
    assert options.as_dict() == {"numerals": True}
    for bad in (["pii"], ["credit_card"]):
        with pytest.raises(ProtocolError):
            parse_redact(bad)
    with pytest.raises(ProtocolError):
        parse_text_options([], numerals="maybe")
