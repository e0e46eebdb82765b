"""The family zoo: one row per model family people run, built tiny.

Each row is a real mlx-lm (or mlx-vlm) architecture at a toy size (hidden 64,
2-4 layers, a small trained vocabulary), with the family's own chat template
(``templates/``, sources in its README) and the special tokens that template
and mlx-lm's detection look for: role markers, think markers, tool-call
markers, image tokens. Layer stacks are chosen so every cache type the
family makes still shows: hybrids keep a linear/SSM layer and an attention
layer, sliding-window families a sliding and a global layer.

A new family is one row in ``FAMILIES``; ``mlxd.factory.zoo_build`` builds it
and the zoo tests run it through every path. ``paths`` records what the row
cannot do and why (mlx-lm's own limits, or mlxd's, named as such), which is
what docs/families.md shows.

Config values ``VOCAB`` are filled in with the trained vocabulary's size,
``EOS`` with the ids of ``eos`` and ``token_id(t)`` with the id of t, so the
table holds no token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VOCAB = "$vocab"
EOS = "$eos"
TOKEN_ID = "$id:"

# What every zoo model is tested on, in the order docs/families.md shows them.
PATHS = ("single", "batched", "streaming", "stop", "tools", "forced_tool", "json_schema", "images")


@dataclass(frozen=True)
class Family:
    name: str
    # The mlx-lm module (``mlx_lm.models.<arch>``), or mlx-vlm's for vision rows.
    arch: str
    # ``config.json`` of the tiny model (VOCAB / EOS placeholders filled in at build time).
    config: dict[str, Any]
    # File under mlxd/factory/templates/.
    template: str
    # Special tokens the tokenizer holds as single ids. ``control`` tokens are
    # special (skipped when decoding with skip_special_tokens); ``markup``
    # tokens are ordinary added tokens that show in the text, as the real
    # tokenizers keep ``<think>`` or ``<tool_call>``.
    control: tuple[str, ...]
    markup: tuple[str, ...] = ()
    bos: str | None = None
    eos: tuple[str, ...] = ()
    pad: str | None = None
    # What mlx-lm makes of the built folder (the zoo tests check all three):
    # the cache classes of make_prompt_cache, the tool parser mlx_lm.load
    # infers from the template, and the think markers TokenizerWrapper finds.
    caches: tuple[str, ...] = ("KVCache",)
    tool_parser: str | None = None
    think: tuple[str, str] | None = None
    vision: bool = False
    # Vision rows: file name -> JSON of the image processor's files.
    processor: dict[str, Any] = field(default_factory=dict)
    # Keys added to tokenizer_config.json (Gemma 3's boi/eoi/image tokens).
    tokenizer_extra: dict[str, Any] = field(default_factory=dict)
    # Seeded matrices are scaled by this (see mlxd.factory.build.WEIGHT_SCALE);
    # some architectures echo one token at 4x and need their own.
    weight_scale: float = 4.0
    # Parameters the class initialises to a constant, drawn at random instead
    # (Gemma 3's projector starts as ones: summing mean-zero features, it
    # would hand the model all-zero image embeddings).
    randomize: tuple[str, ...] = ()
    seed: int = 0
    # path -> why it is not supported for this family (see PATHS).
    unsupported: dict[str, str] = field(default_factory=dict)
    # What the family really is, for docs/families.md.
    note: str = ""

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


def token_id(token: str) -> str:
    return TOKEN_ID + token


def _tiny(**extra: Any) -> dict[str, Any]:
    """The toy layer shapes every row starts from (keys an architecture does
    not know are ignored by its ModelArgs.from_dict)."""
    return {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "eos_token_id": EOS,
        **extra,
    }


def _qwen_text(**extra: Any) -> dict[str, Any]:
    return _tiny(**{"rope_theta": 1_000_000.0, "tie_word_embeddings": True, **extra})


# Gated DeltaNet layers (Qwen3-Next, Qwen3.5): layer i is linear unless
# (i + 1) % full_attention_interval == 0, so two layers make [linear, full].
_LINEAR_ATTENTION = {
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 2,
}
_QWEN_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# DeepSeek-style routing (DeepSeek-V3, GLM-4.5): a dense first layer, then
# routed experts beside a shared one.
_ROUTED_MOE = {
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
}
_QWEN = {
    "control": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    "markup": ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    "eos": ("<|im_end|>", "<|endoftext|>"),
    "pad": "<|endoftext|>",
    "think": ("<think>", "</think>"),
}
_GEMMA3 = {
    "control": ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>",
                "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
    "bos": "<bos>",
    "eos": ("<end_of_turn>", "<eos>"),
    "pad": "<pad>",
}
_QWEN_VL_PIXELS = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_pixels": 32 * 32,
    "max_pixels": 128 * 128,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
_QWEN_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_HYBRID = ("ArraysCache", "KVCache")
_SLIDING = ("KVCache", "RotatingKVCache")

_NO_PARSER = "mlx-lm 0.32.2 has no tool parser for this family's call format ({})"
_NO_TOOLS = {"forced_tool": "no tool parser (see tools)"}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            name="qwen3",
            arch="qwen3",
            config={"model_type": "qwen3", **_qwen_text()},
            template="qwen3.jinja",
            tool_parser="json_tools",
            note="Qwen3 dense (0.6B-32B)",
            **_QWEN,
        ),
        Family(
            name="qwen3_moe",
            arch="qwen3_moe",
            config={"model_type": "qwen3_moe", **_qwen_text(tie_word_embeddings=False), **_QWEN_MOE},
            template="qwen3.jinja",
            tool_parser="json_tools",
            seed=1,
            note="Qwen3-30B-A3B, Qwen3-235B-A22B",
            **_QWEN,
        ),
        Family(
            name="qwen3_next",
            arch="qwen3_next",
            config={
                "model_type": "qwen3_next",
                **_qwen_text(tie_word_embeddings=False, partial_rotary_factor=0.25),
                **_LINEAR_ATTENTION,
                **_QWEN_MOE,
                "shared_expert_intermediate_size": 64,
            },
            template="qwen3.jinja",
            caches=_HYBRID,
            tool_parser="json_tools",
            note="Qwen3-Next-80B-A3B: Gated DeltaNet + attention hybrid, MoE",
            **_QWEN,
        ),
        Family(
            name="qwen3_5",
            arch="qwen3_5",
            config={
                "model_type": "qwen3_5",
                "text_config": {
                    "model_type": "qwen3_5_text",
                    **_qwen_text(),
                    **_LINEAR_ATTENTION,
                    "rope_parameters": {
                        "type": "default",
                        "mrope_section": [1, 1, 0],
                        "rope_theta": 100_000.0,
                        "partial_rotary_factor": 0.25,
                    },
                },
                "eos_token_id": EOS,
            },
            template="qwen3_5.jinja",
            caches=_HYBRID,
            tool_parser="qwen3_coder",
            unsupported={"images": "built text-only: mlx-lm drops Qwen3.5's vision tower (mlx-vlm's qwen3_5 is not in the zoo yet)"},
            note="Qwen3.5 / 3.6: Gated DeltaNet + attention hybrid; XML tool calls (qwen3_coder), opens a think block",
            **{**_QWEN, "control": (*_QWEN["control"], *_QWEN_VISION)},
        ),
        Family(
            name="gemma3_text",
            arch="gemma3_text",
            config={
                "model_type": "gemma3_text",
                **_tiny(num_key_value_heads=1, query_pre_attn_scalar=16),
                # [sliding, global]: layer i is global when (i + 1) % pattern == 0.
                "sliding_window": 32,
                "sliding_window_pattern": 2,
            },
            template="gemma3.jinja",
            caches=_SLIDING,
            # Gemma 3's template has no place for tools: mlxd writes them into the prompt (json_tools).
            **_GEMMA3,
            note="Gemma 3 1B-27B text: 5 sliding-window layers to 1 global (here 1:1, window 32)",
        ),
        Family(
            name="gemma4_text",
            arch="gemma4_text",
            config={
                "model_type": "gemma4_text",
                **_tiny(num_hidden_layers=4, num_key_value_heads=1),
                "global_head_dim": 32,
                "vocab_size_per_layer_input": VOCAB,
                "hidden_size_per_layer_input": 16,
                # The last two layers read the KV of the first two, as Gemma 4 E2B/E4B do.
                "num_kv_shared_layers": 2,
                "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
            },
            template="gemma4_text.jinja",
            control=("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|image|>", "<|audio|>", "<|video|>"),
            markup=("<|think|>", "<|channel>", "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
                    "<|tool_response>", "<tool_response|>", '<|"|>'),
            bos="<bos>",
            eos=("<turn|>", "<eos>"),
            pad="<pad>",
            caches=_SLIDING,
            tool_parser="gemma4",
            think=("<|channel>thought", "<channel|>"),
            weight_scale=1.0,
            note="Gemma 4: sliding + global layers, KV shared across the last layers; `<|channel>thought` reasoning",
        ),
        Family(
            name="gpt_oss",
            arch="gpt_oss",
            config={
                "model_type": "gpt_oss",
                **_tiny(intermediate_size=64),
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "sliding_window": 32,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            template="gpt_oss.jinja",
            control=("<|startoftext|>", "<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                     "<|constrain|>", "<|return|>", "<|call|>"),
            eos=("<|return|>", "<|call|>", "<|endoftext|>"),
            pad="<|endoftext|>",
            caches=_SLIDING,
            # Calls are harmony messages, parsed (and forced) by mlxd (mlxd.tools.harmony); mlx-lm has no parser.
            seed=1,
            note="gpt-oss-20b/120b: alternating sliding/full attention with sinks, MoE, harmony format",
        ),
        Family(
            name="deepseek_v3",
            arch="deepseek_v3",
            config={
                "model_type": "deepseek_v3",
                **_tiny(num_key_value_heads=4),
                **_ROUTED_MOE,
                # Multi-head latent attention: the cache holds the compressed latent.
                "kv_lora_rank": 32,
                "q_lora_rank": 32,
                "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 16,
                "v_head_dim": 16,
            },
            template="deepseek_v3.jinja",
            control=("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
                     "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                     "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
            markup=("<think>", "</think>"),
            bos="<｜begin▁of▁sentence｜>",
            eos=("<｜end▁of▁sentence｜>",),
            pad="<｜end▁of▁sentence｜>",
            think=("<think>", "</think>"),
            # Its template renders earlier calls but has no place for a tool list: mlxd writes
            # the tools into the prompt (json_tools); mlx-lm has no parser for its own
            # `<｜tool▁calls▁begin｜>` calls.
            note="DeepSeek-V3 / V3.1 / R1: MLA (latent KV), MoE; V3.1's hybrid-thinking template",
        ),
        Family(
            name="glm4_moe",
            arch="glm4_moe",
            config={
                "model_type": "glm4_moe",
                **_tiny(rms_norm_eps=1e-5),
                **_ROUTED_MOE,
                "rope_theta": 1_000_000.0,
                "rope_scaling": None,
                "use_qk_norm": True,
                "tie_word_embeddings": False,
                "attention_bias": True,
                "partial_rotary_factor": 0.5,
            },
            template="glm4_moe.jinja",
            control=("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
            markup=("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                    "</arg_value>", "<tool_response>", "</tool_response>"),
            eos=("<|endoftext|>", "<|user|>", "<|observation|>"),
            pad="<|endoftext|>",
            tool_parser="glm47",
            think=("<think>", "</think>"),
            note="GLM-4.5 / 4.6 / 4.7: MoE; `<arg_key>` tool calls (glm47 parser)",
        ),
        Family(
            name="mistral3",
            arch="mistral3",
            config={
                "model_type": "mistral3",
                "text_config": {
                    "model_type": "mistral",
                    **_tiny(rms_norm_eps=1e-5, rope_theta=1_000_000_000.0, tie_word_embeddings=False),
                },
                "eos_token_id": EOS,
            },
            template="mistral3.jinja",
            control=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                     "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[IMG]"),
            markup=("[TOOL_CALLS]",),
            bos="<s>",
            eos=("</s>",),
            pad="<unk>",
            tool_parser="mistral",
            unsupported={"images": "built text-only: mlx-lm loads Mistral Small 3.1's language model alone"},
            note="Mistral Small 3.1 / 3.2 (mistral3 wrapping a Mistral text model); `[TOOL_CALLS]` tool calls",
        ),
        Family(
            name="ministral3",
            arch="mistral3",
            config={
                "model_type": "mistral3",
                "text_config": {
                    "model_type": "ministral3",
                    **_tiny(rms_norm_eps=1e-5, tie_word_embeddings=False),
                    # Ministral 3's own rope block: YaRN plus Llama 4's position-dependent query scale.
                    "rope_parameters": {
                        "rope_type": "yarn",
                        "rope_theta": 1_000_000.0,
                        "factor": 16.0,
                        "original_max_position_embeddings": 16384,
                        "beta_fast": 32.0,
                        "beta_slow": 1.0,
                        "mscale": 1.0,
                        "mscale_all_dim": 1.0,
                        "llama_4_scaling_beta": 0.1,
                    },
                },
                "eos_token_id": EOS,
            },
            template="ministral3.jinja",
            control=("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                     "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[IMG]"),
            markup=("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]"),
            bos="<s>",
            eos=("</s>",),
            pad="<unk>",
            tool_parser="mistral",
            # `[THINK]`/`[/THINK]` are single tokens, but mlx-lm 0.32.2 detects no think pair for them.
            unsupported={"images": "built text-only: mlx-lm loads Ministral 3's language model alone"},
            note="Ministral 3 3B/8B/14B Reasoning (Dec 2025; mistral3 wrapping a ministral3 text model); "
                 "`[THINK]` reasoning, `[TOOL_CALLS]name[ARGS]` calls",
        ),
        Family(
            name="lfm2",
            arch="lfm2",
            config={
                "model_type": "lfm2",
                **_tiny(num_hidden_layers=3),
                "norm_eps": 1e-5,
                "conv_bias": False,
                "conv_L_cache": 3,
                "block_dim": 64,
                "block_ff_dim": 128,
                "block_multiple_of": 16,
                "block_ffn_dim_multiplier": 1.0,
                "block_auto_adjust_ff_dim": False,
                "layer_types": ["conv", "full_attention", "conv"],
            },
            template="lfm2.jinja",
            control=("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                     "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_response_start|>", "<|tool_response_end|>",
                     "<image>"),
            markup=("<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>"),
            bos="<|startoftext|>",
            eos=("<|im_end|>", "<|endoftext|>"),
            pad="<|pad|>",
            caches=_HYBRID,
            tool_parser="pythonic",
            think=("<think>", "</think>"),
            note="LFM2 / LFM2.5: short convolutions + attention hybrid; pythonic tool calls",
        ),
        Family(
            name="nemotron_h",
            arch="nemotron_h",
            config={
                "model_type": "nemotron_h",
                **_tiny(),
                "attention_bias": False,
                "mamba_num_heads": 4,
                "mamba_head_dim": 16,
                "mamba_proj_bias": False,
                "ssm_state_size": 16,
                "conv_kernel": 4,
                "n_groups": 1,
                "mlp_bias": False,
                "layer_norm_epsilon": 1e-5,
                "use_bias": False,
                "use_conv_bias": True,
                # Mamba-2, attention, MLP: Nemotron-H's three block kinds.
                "hybrid_override_pattern": ["M", "*", "-"],
            },
            template="nemotron_h.jinja",
            control=("<unk>", "<s>", "</s>", "<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>"),
            markup=("<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>",
                    "<TOOL_RESPONSE>", "</TOOL_RESPONSE>"),
            eos=("<SPECIAL_12>", "</s>"),
            pad="<unk>",
            caches=_HYBRID,
            think=("<think>", "</think>"),
            unsupported={"tools": _NO_PARSER.format("`<TOOLCALL>[...]`"), **_NO_TOOLS},
            note="Nemotron-H / Nemotron Nano 2: Mamba-2 + attention hybrid",
        ),
        Family(
            name="qwen3_vl",
            arch="qwen3_vl",
            config={
                "model_type": "qwen3_vl",
                "text_config": {
                    "model_type": "qwen3_vl",
                    **_qwen_text(rope_theta=5_000_000.0),
                    # M-RoPE: (time, height, width) sections of the head's 8 rotary pairs.
                    "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                },
                "vision_config": {
                    "model_type": "qwen3_vl",
                    "depth": 2,
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "out_hidden_size": 64,
                    "num_heads": 2,
                    "patch_size": 16,
                    "spatial_merge_size": 2,
                    "temporal_patch_size": 2,
                    "num_position_embeddings": 64,
                    "deepstack_visual_indexes": [1],
                },
                "image_token_id": token_id("<|image_pad|>"),
                "video_token_id": token_id("<|video_pad|>"),
                "vision_start_token_id": token_id("<|vision_start|>"),
                "vision_end_token_id": token_id("<|vision_end|>"),
                "vocab_size": VOCAB,
                "tie_word_embeddings": True,
                "eos_token_id": EOS,
            },
            template="qwen3_vl.jinja",
            vision=True,
            # At most 128x128 pixels: 64 patches of 16, merged 2x2 into 16 prompt tokens.
            processor={
                "preprocessor_config.json": _QWEN_VL_PIXELS,
                "video_preprocessor_config.json": _QWEN_VL_PIXELS,
                "processor_config.json": {},
            },
            tool_parser="json_tools",
            note="Qwen3-VL 2B-32B (Thinking template): DeepStack vision features into the first layers",
            **{**_QWEN, "control": (*_QWEN["control"], *_QWEN_VISION)},
        ),
        Family(
            name="gemma3",
            arch="gemma3",
            config={
                "model_type": "gemma3",
                "text_config": {
                    "model_type": "gemma3_text",
                    **_tiny(num_key_value_heads=1, query_pre_attn_scalar=16),
                    "sliding_window": 32,
                    "sliding_window_pattern": 2,
                    "mm_tokens_per_image": 4,
                },
                # SigLIP at 56x56 pixels: 4x4 patches of 14, pooled to 2x2 = 4 prompt tokens.
                "vision_config": {
                    "model_type": "siglip_vision_model",
                    "num_hidden_layers": 2,
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_attention_heads": 2,
                    "patch_size": 14,
                    "image_size": 56,
                },
                "image_token_index": token_id("<image_soft_token>"),
                "boi_token_index": token_id("<start_of_image>"),
                "eoi_token_index": token_id("<end_of_image>"),
                "mm_tokens_per_image": 4,
                "vocab_size": VOCAB,
                "eos_token_id": EOS,
            },
            template="gemma3.jinja",
            vision=True,
            processor={
                "preprocessor_config.json": {
                    "image_processor_type": "Gemma3ImageProcessor",
                    "processor_class": "Gemma3Processor",
                    "size": {"height": 56, "width": 56},
                    "image_mean": [0.5, 0.5, 0.5],
                    "image_std": [0.5, 0.5, 0.5],
                    "do_resize": True,
                    "do_rescale": True,
                    "rescale_factor": 1 / 255,
                    "do_normalize": True,
                    "do_convert_rgb": True,
                    "resample": 2,
                },
                "processor_config.json": {"processor_class": "Gemma3Processor", "image_seq_length": 4},
            },
            tokenizer_extra={
                "extra_special_tokens": {
                    "boi_token": "<start_of_image>",
                    "eoi_token": "<end_of_image>",
                    "image_token": "<image_soft_token>",
                },
            },
            caches=_SLIDING,
            unsupported={
                "tools": "Gemma 3's template renders no tools, and mlxd writes them into image turns' text "
                         "not yet: a 400 names `tools`",
                "forced_tool": "no tools (see tools)",
            },
            weight_scale=0.5,
            randomize=("multi_modal_projector.mm_input_projection_weight",),
            note="Gemma 3 4B-27B with its SigLIP vision tower",
            **_GEMMA3,
        ),
    )
}
