"""A vision request as the model prefills it: the messages rendered with
mlx-vlm's chat template (an image part where the client put it), then
tokenized together with the images by the model's processor, which expands
each image into as many vision tokens as its size makes.

The vision engine prefills these inputs; ``count_tokens`` counts them with
the processor and model config alone (``load_vision_processor``: no
weights), so a count equals the prompt the model really gets. mlx-vlm hands
the inputs back as MLX arrays; only their shapes are read off the worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.engine.types import PromptEnd
from mlxd.errors import BadRequest, describe_exception

log = logging.getLogger(__name__)

IMAGE_PARTS = ("image", "image_url", "input_image")


@dataclass
class VisionInputs:
    prompt: str
    # mlx-vlm's ``prepare_inputs``: input_ids, pixel_values, attention_mask, ...
    inputs: dict[str, Any]

    @property
    def n_tokens(self) -> int:
        return int(self.inputs["input_ids"].shape[-1])


@dataclass(frozen=True)
class VisionProcessor:
    """What rendering and tokenizing need of a vision model: its processor
    (tokenizer and image processor) and its model config."""

    processor: Any
    config: Any


def load_vision_processor(path: Path, *, trust_remote_code: bool = False) -> VisionProcessor:
    """The processor and model config ``mlx_vlm.load`` would give, without
    reading a weight."""
    from mlx_vlm.utils import get_model_and_args, load_config, load_image_processor, load_processor

    options = {"trust_remote_code": trust_remote_code}
    config = load_config(path, **options)
    model_class, _ = get_model_and_args(config=config, model_path=path)
    model_config = model_class.ModelConfig.from_dict(config)
    processor = load_processor(path, True, eos_token_ids=getattr(model_config, "eos_token_id", None), **options)
    image_processor = load_image_processor(path, **options)
    if image_processor is not None:
        processor.image_processor = image_processor
    return VisionProcessor(processor, model_config)


def prepare_vision_inputs(
    processor: Any,
    config: Any,
    *,
    messages: list[dict[str, Any]] | None = None,
    prompt: str | None = None,
    images: list[Any] | tuple[Any, ...] = (),
    template_kwargs: dict[str, Any] | None = None,
    end: PromptEnd = "new_turn",
) -> VisionInputs:
    """Render and tokenize: everything about the prompt that can fail
    before decoding fails here, as a BadRequest naming the request's field.
    ``end``: where the chat prompt ends (``mlxd.engine.prompt`` says how)."""
    from mlx_vlm import apply_chat_template, prepare_inputs
    from mlx_vlm.utils import should_add_special_tokens

    if (prompt is None) == (messages is None):
        raise BadRequest("Give exactly one of `prompt` and `messages`.", param="messages")
    images = list(images)
    param = "messages" if messages is not None else "prompt"
    if messages is not None:
        parts = template_messages(messages, len(images))
        try:
            # The template's variables (enable_thinking ...) pass through mlx-vlm to the template.
            ending = {"continue_final_message": True} if end == "continue" else {}
            text = apply_chat_template(processor, config, parts, num_images=len(images),
                                       add_generation_prompt=end == "new_turn", **ending, **(template_kwargs or {}))
        except Exception as exc:  # templates and mlx-vlm's formatter raise their own types
            raise BadRequest(
                f"The chat template rejected the messages: {describe_exception(exc)}", param=param
            ) from exc
    else:
        if images:
            raise BadRequest("Images need chat messages; use /v1/chat/completions.", param="prompt")
        text = prompt or ""
    if not isinstance(text, str):
        raise BadRequest("This model's chat template does not render a text prompt.", param=param)
    try:
        inputs = dict(
            prepare_inputs(
                processor,
                images=images or None,
                prompts=text,
                image_token_index=getattr(config, "image_token_index", None),
                add_special_tokens=should_add_special_tokens(config.model_type, processor),
            )
        )
    except Exception as exc:
        log.warning("preparing vision inputs failed: %s", describe_exception(exc))
        raise BadRequest(
            "The images could not be prepared for this model (too small, or an unusual shape).",
            param=param,
        ) from exc
    prepared = VisionInputs(text, inputs)
    if prepared.n_tokens == 0:
        raise BadRequest("The prompt is empty.", param=param)
    return prepared


def template_messages(messages: list[dict[str, Any]], n_images: int) -> list[dict[str, Any]]:
    """OpenAI messages as mlx-vlm's formatter takes them: image parts (whatever
    their payload) become ``{"type": "image"}`` in place, so the template puts
    each image where the client put it. The count must match the images given."""
    out = []
    seen = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest("Each message must be an object.", param=f"messages[{i}]")
        content = message.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in IMAGE_PARTS:
                    if message.get("role") != "user":
                        # mlx-vlm's formatter would drop it from the prompt.
                        raise BadRequest(
                            "Images are accepted in user messages only.", param=f"messages[{i}].content"
                        )
                    parts.append({"type": "image"})
                    seen += 1
                elif kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                else:
                    raise BadRequest(
                        f"Message content of type `{kind}` is not supported.", param=f"messages[{i}].content"
                    )
            content = parts
        elif not isinstance(content, str):
            raise BadRequest("Message content must be a string or a list of parts.", param=f"messages[{i}]")
        out.append({**message, "content": content})
    if seen != n_images:
        raise BadRequest(
            f"The messages hold {seen} image parts but {n_images} images were decoded.", param="messages"
        )
    return out
