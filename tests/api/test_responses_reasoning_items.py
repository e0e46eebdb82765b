"""How the Responses surface reads reasoning sent back: the pieces of one
turn's reasoning (several reasoning items, an item's summary parts) reach
the template as one text, a blank line apart, as thinking blocks do on the
Anthropic surface; run together, two thoughts read as one sentence."""

from __future__ import annotations

from mlxd.api.responses.answers import Outcome
from mlxd.api.responses.bodies import ResponsesRequest


def summary(*texts: str) -> list[dict[str, str]]:
    return [{"type": "summary_text", "text": t} for t in texts]


def test_reasoning_items_and_summary_parts_sent_back_are_a_blank_line_apart():
    body = ResponsesRequest(model="m", input=[
        {"role": "user", "content": "Fix the file."},
        {"type": "reasoning", "id": "rs_1", "summary": summary("The file is YAML.", "Two keys are wrong.")},
        {"type": "reasoning", "id": "rs_2", "content": [{"type": "reasoning_text", "text": "Rename both."}],
         "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
    ])
    answer = body.history(())[-1]
    assert answer.role == "assistant" and [p.text for p in answer.content] == ["Done."]
    assert answer.reasoning == "The file is YAML.\n\nTwo keys are wrong.\n\nRename both."


def test_a_stored_answer_with_one_reasoning_item_keeps_its_text_as_written():
    outcome = Outcome(output=[
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Think.\nMore."}]},
        {"type": "message", "content": [{"type": "output_text", "text": "Answer."}]},
    ])
    assert outcome.output_message().reasoning == "Think.\nMore."
