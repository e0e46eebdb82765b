"""Documents attached to a message reach the model as text, or as a line
saying a file it cannot read was attached: never left out without a word."""

from __future__ import annotations

import base64

from mlxd.api.documents import anthropic_document, input_file

NOTE = "The secret code is 4417. It is kept in the vault under row nine."
B64 = base64.b64encode(NOTE.encode()).decode()


def test_an_anthropic_document_of_text_is_its_text_under_its_title():
    plain = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": NOTE}}
    assert anthropic_document(plain) == NOTE
    titled = {**plain, "title": "vault.txt", "context": "from the ops wiki"}
    assert anthropic_document(titled) == f"Document: vault.txt\nfrom the ops wiki\n{NOTE}"
    content = {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": NOTE}]}}
    assert anthropic_document(content) == NOTE
    encoded = {"type": "document", "source": {"type": "base64", "media_type": "text/markdown", "data": B64}}
    assert anthropic_document(encoded) == NOTE
    found = {"type": "search_result", "source": "https://wiki/vault", "title": "Vault",
             "content": [{"type": "text", "text": NOTE}]}
    assert anthropic_document(found) == f"Document: Vault\nhttps://wiki/vault\n{NOTE}"


def test_a_document_mlxd_cannot_read_says_so_by_its_kind():
    pdf = {"type": "document", "title": "report.pdf",
           "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}}
    said = anthropic_document(pdf)
    assert "`report.pdf`" in said and "application/pdf" in said and "cannot read it" in said
    assert "a document by url" in anthropic_document({"type": "document", "source": {"type": "url", "url": "x"}})


def test_a_responses_input_file_is_its_text_or_says_it_cannot_be_read():
    assert input_file({"type": "input_file", "filename": "vault.txt",
                       "file_data": f"data:text/plain;base64,{B64}"}) == f"Document: vault.txt\n{NOTE}"
    assert input_file({"type": "input_file", "file_data": B64}) == NOTE
    pdf = input_file({"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0x"})
    assert "application/pdf" in pdf and "cannot read it" in pdf
    assert "by a file_id" in input_file({"type": "input_file", "file_id": "file-123"})
