"""Shared fixtures of the adapter tests: a local tokenizer folder with a chat template (built here,
nothing is downloaded) and the sample logs of trajectories/samples."""

import pytest

WORDS = "you are an agent . task : add 2 and 3 then 4 calc + result 5 9 answer correct wrong the is".split()


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    """A PreTrainedTokenizerFast over WORDS (the environments' word-level tokenizer) with the chat
    template ``<|role|> content <|eot|>`` per message, saved with save_pretrained."""
    from mpo_viz.envs.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(WORDS).save_pretrained(str(d))
    return d


@pytest.fixture(scope="session")
def tok(tok_dir):
    from mpo_viz.data.token_text import load_local_tokenizer

    return load_local_tokenizer(tok_dir)


@pytest.fixture(scope="session")
def ids(tok):
    """Word → id of the test tokenizer (role markers included)."""
    return lambda text: list(tok(text, add_special_tokens=False)["input_ids"])
