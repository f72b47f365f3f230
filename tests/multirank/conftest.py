import pytest


@pytest.fixture(scope="session")
def arithmetic_tokenizer_dir(tmp_path_factory):
    from tandem.tasks.arithmetic import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer"))
