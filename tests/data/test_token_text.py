"""Display text of token ids: a multi-byte character split across byte-level tokens shows once,
whole, on the token that completes it; the hover notes list the raw pieces."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mpo_viz.data.token_text import (
    char_notes,
    guess_split_groups,
    merged_texts,
    raw_bytes_of,
    tokenizer_decoder,
)

SUN = "☀".encode()  # e2 98 80
HAPPY = "😀".encode()  # f0 9f 98 80


def fake(pieces: list[bytes]):
    """ids 0..n-1 whose bytes are ``pieces``: (ids, decode-one, raw) as a byte-level tokenizer has them."""
    return list(range(len(pieces))), (lambda i: pieces[i].decode("utf-8", "replace")), (lambda i: pieces[i])


@pytest.mark.parametrize(
    "pieces,texts,groups",
    [
        # no split: exactly the tokens' own decodings
        ([b"the", b" sun"], ["the", " sun"], []),
        # one character in three one-byte tokens
        ([b" ", SUN[:1], SUN[1:2], SUN[2:], b"!"], [" ", "", "", "☀", "!"], [(1, 3)]),
        # a four-byte emoji, the first piece also holding a space
        ([b" " + HAPPY[:1], HAPPY[1:3], HAPPY[3:]], [" ", "", "😀"], [(0, 2)]),
        # two characters over three tokens: the middle one completes the first and starts the second
        ([SUN[:2], SUN[2:] + SUN[:1], SUN[1:]], ["", "☀", "☀"], [(0, 1), (1, 2)]),
        # a lone lead byte before ASCII: the broken byte shows as U+FFFD where that becomes known, no group
        ([SUN[:1], b"a"], ["", "\ufffda"], []),
        # a character cut off at the end of the response: U+FFFD on the last token
        ([b"x", SUN[:2]], ["x", "\ufffd"], []),
    ],
)
def test_merged_texts_by_hand(pieces, texts, groups):
    ids, one, raw = fake(pieces)
    got, got_groups = merged_texts(ids, one, raw)
    assert got == texts and got_groups == groups
    assert "".join(got) == b"".join(pieces).decode("utf-8", "replace")  # nothing lost, nothing doubled


def test_without_raw_bytes_the_tokens_stay_as_decoded():
    ids, one, _ = fake([SUN[:1], SUN[1:]])
    assert merged_texts(ids, one, None) == (["\ufffd", "\ufffd\ufffd"], [])  # Python's own per-token decode


def test_notes_list_the_raw_pieces_and_groups_are_recovered_from_texts():
    ids, one, raw = fake([b" ", SUN[:1], SUN[1:2], SUN[2:]])
    texts, groups = merged_texts(ids, one, raw)
    assert guess_split_groups(texts) == groups == [(1, 3)]
    notes = char_notes(texts, ids, groups, raw)
    assert (
        notes[3] == "'☀': one character split across 3 tokens, shown on the last: #1 id 1 bytes e2; #2 id 2 bytes 98; "
        "#3 id 3 bytes 80"
    )
    assert notes[1] == "part of '☀' (shown whole on token #3): #1 id 1 bytes e2" and 0 not in notes
    # from stored texts alone (no tokenizer): the ids are the pieces
    assert char_notes(texts, ids, groups)[2] == "part of '☀' (shown whole on token #3): #2 id 2"
    # an empty token before ASCII text is not a split character
    assert guess_split_groups(["", "a", "", ""]) == []


@pytest.fixture(scope="module")
def bytelevel():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280,
        special_tokens=["<|end|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["the sun is up", "sun sun"] * 3, trainer)
    return tok


def test_a_real_byte_level_tokenizer(bytelevel):
    hf = PreTrainedTokenizerFast(tokenizer_object=bytelevel, eos_token="<|end|>")
    ids = hf("the ☀ is up", add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
    raw = raw_bytes_of(hf)
    assert b"".join(raw(i) for i in ids) == "the ☀ is up<|end|>".encode()
    for t in (hf, bytelevel):  # a transformers tokenizer and a bare tokenizers.Tokenizer
        decode = tokenizer_decoder(t)
        texts = decode(ids)
        assert "".join(texts) == "the ☀ is up<|end|>" and texts.count("☀") == 1 and "\ufffd" not in "".join(texts)
        k = texts.index("☀")
        assert texts[k - 2 : k] == ["", ""]  # e2 and 98 before it, each a token of its own
        _, notes = decode.with_notes(ids)
        assert sorted(notes) == [k - 2, k - 1, k] and "bytes e2; " in notes[k] and notes[k].endswith("bytes 80")


def test_word_level_tokenizers_have_no_byte_view():
    from mpo_viz.envs.tokenizer import build_tokenizer

    assert raw_bytes_of(build_tokenizer(["a", "b"])) is None
