"""docs/config-reference.md is what the schema gives (tandem/config/reference_doc.py): every key, with its
default and the comment next to its field, and no key without a meaning."""
import dataclasses

from tandem.config import reference_doc
from tandem.config.verl_compat import TandemKeys


def test_the_page_is_the_schemas():
    assert reference_doc.PAGE.read_text() == reference_doc.reference_markdown(), \
        "docs/config-reference.md is stale: python -m tandem.config.reference_doc --write"


def test_every_key_is_on_the_page_with_a_meaning():
    covered = {f"{path}.{f.name}" for s in reference_doc.sections() for path in s.paths
               for f in dataclasses.fields(s.cls) if not dataclasses.is_dataclass(getattr(s.values[0], f.name))}
    assert covered == set(TandemKeys.of_schema().defaults)
    assert reference_doc.missing_meanings() == [], "write a comment next to these fields in the schema"


def test_a_changed_comment_changes_the_page(monkeypatch):
    """Control: the page follows the comments, so the first test fails when one changes."""
    comments = reference_doc.read_comments()
    comments.fields[("DataConfig", "train_batch_size")] = "a meaning nobody wrote"
    monkeypatch.setattr(reference_doc, "read_comments", lambda: comments)
    page = reference_doc.reference_markdown()
    assert "| `data.train_batch_size` | `128` | a meaning nobody wrote |" in page
    assert page != reference_doc.PAGE.read_text()
