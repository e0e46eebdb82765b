"""Constrained decoding with llguidance: grammars compiled per model, applied as logits processors.

``compiler.GrammarCompiler`` (one per loaded model) turns a
``mlxd.engine.types.Constraint`` into a fresh llguidance matcher, caching the
compiled grammar; ``processor.GrammarProcessor`` is the mlx-lm logits
processor that walks that matcher token by token and masks the rest.
"""
