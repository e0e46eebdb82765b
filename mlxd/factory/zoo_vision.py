"""Writes a vision row of the zoo: mlx-vlm's own model class for the family,
seeded, with the family's tokenizer files and its image processor's files,
so ``mlx_vlm.load(path)`` takes the same path for it as for the real model."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from mlxd.factory.zoo import Family
from mlxd.factory.zoo_files import resolve_config, seeded_weights, train_family_tokenizer, write_tokenizer_files


def write_vision_family(family: Family, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import update_module_configs

    tok = train_family_tokenizer(family, files)
    write_tokenizer_files(family, tok, out)
    config = resolve_config(family.config, tok, family.eos)
    module = importlib.import_module(f"mlx_vlm.models.{family.arch}")
    # As mlx_vlm.utils.load_model builds it: each module's config becomes its own class.
    fields = json.loads(json.dumps(config))
    model_config = update_module_configs(module.ModelConfig.from_dict(fields), module, fields, ["text", "vision"])
    mx.random.seed(family.seed)
    model = module.Model(model_config)
    seeded_weights(model, family)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for name, content in family.processor.items():
        (out / name).write_text(json.dumps(resolve_config(content, tok), indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
