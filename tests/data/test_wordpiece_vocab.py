"""WordPiece vocabulary building with tensorflow-text, and tokenisation with BertTokenizer."""

import pytest

from ce_retrieval.data.vocab import RESERVED_TOKENS, build_vocab, read_vocab, tokenizer, write_vocab

CORPUS = [
    "A man rides a bicycle down the street.",
    "Two dogs are playing in the snow!",
    "A woman is reading a book in the park.",
    "Children playing football on the beach",
    "A dog catches a frisbee in the park",
    "Men riding bicycles on a mountain road",
    "Café terrace with people drinking coffee",
] * 4


def test_vocab_tokenises_its_corpus_with_few_unknowns(tmp_path):
    vocab = build_vocab(CORPUS, vocab_size=300)
    assert tuple(vocab[:5]) == RESERVED_TOKENS and len(vocab) <= 300 and len(set(vocab)) == len(vocab)
    path = write_vocab(vocab, str(tmp_path / "v" / "vocab.txt"))
    assert read_vocab(path) == vocab
    tok = tokenizer(path)
    ids = tok.tokenize(CORPUS).merge_dims(-2, -1)
    flat = ids.flat_values.numpy()
    assert (flat == RESERVED_TOKENS.index("[UNK]")).mean() < 0.02
    # Lower-casing and accent folding match BertTokenizer(lower_case=True): "CAFÉ" == "café" == "cafe".
    a, b = tok.tokenize(["CAFÉ DOGS"]).flat_values.numpy(), tok.tokenize(["cafe dogs"]).flat_values.numpy()
    assert list(a) == list(b)
    # Unseen words fall back to word pieces or [UNK], never fail.
    assert tok.tokenize(["xylophone"]).flat_values.shape[0] >= 1


def test_vocab_is_deterministic_and_validated(tmp_path):
    assert build_vocab(CORPUS, vocab_size=200) == build_vocab(CORPUS, vocab_size=200)
    bad = tmp_path / "bad.txt"
    bad.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="must start with"):
        read_vocab(str(bad))
    with pytest.raises(ValueError, match="vocab_size"):
        build_vocab(CORPUS, vocab_size=3)
    with pytest.raises(ValueError, match="empty"):
        build_vocab([], vocab_size=100)


def test_one_reader_accepts_built_and_pretrained_bert_vocabs(tmp_path):
    # The data pipeline's and the text tower's readers disagreed: the first wanted the five specials first (so it
    # refused a pretrained BERT vocab.txt, whose [UNK] [CLS] [SEP] follow [unusedN] tokens), the second only that
    # the four the tokenizer and packer look up are present (it also dropped trailing blank lines, which the
    # tower's lookup table then refused). The rule: those four anywhere, unique tokens, no blank lines.
    from ce_retrieval.modeling import text_tower

    assert text_tower.read_vocab is read_vocab
    bert = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "dog", "##s"]
    path = tmp_path / "bert_vocab.txt"
    path.write_bytes(("\r\n".join(bert) + "\r\n").encode())  # CRLF line ends
    assert read_vocab(str(path)) == bert
    ids = tokenizer(str(path)).tokenize(["The dogs", "zebra"]).merge_dims(-2, -1).to_list()
    assert ids == [[7, 8, 9], [3]]  # [UNK] is found by name (id 3 here)
    for bad, match in ((bert[:5] + bert[6:], r"\[SEP\]"), (bert + ["dog"], "duplicate"), (bert + [""], "empty")):
        path.write_text("\n".join(bad) + "\n")
        with pytest.raises(ValueError, match=match):
            read_vocab(str(path))
    with pytest.raises(FileNotFoundError):
        read_vocab(str(tmp_path / "missing.txt"))
