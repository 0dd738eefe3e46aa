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
