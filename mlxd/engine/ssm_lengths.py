"""Nemotron-H's Mamba-2 mixer given the lengths of a right-padded batch.

A speculative batch feeds rows of different lengths right-padded, with each
row's length in its state layers (``ArraysCache.prepare(lengths=...)``):
its hybrid replay after a verified block (``speculative_cache.replay``) and
a draft model's step (``speculative_drafters``). mlx-lm 0.32.2's nemotron_h
mixer reads those lengths for its convolution but does not pass them to
``ssm_update``, as its own mamba2 mixer does: the SSM then takes the state
at the padded block's end, where the mask has zeroed every contribution,
so a row shorter than the longest lost the tokens it kept and its output
drifted from what it writes without speculation. Without lengths (every
other path) the mixer is unchanged.

The fix is per model, not a patch of mlx-lm's class: each loaded mixer is
given a subclass whose ``_ssm`` passes the lengths, as mamba2's does.
Worker thread (MLX).
"""

from __future__ import annotations

from typing import Any


def pass_ssm_lengths(model: Any) -> int:
    """Every nemotron_h Mamba-2 mixer in ``model`` made to pass its cache's
    lengths to the SSM; how many were changed."""
    try:
        from mlx_lm.models import nemotron_h
    except ImportError:
        return 0
    mixer_class = getattr(nemotron_h, "NemotronHMamba2Mixer", None)
    if mixer_class is None or not hasattr(model, "modules"):
        return 0
    fixed_class = _fixed(mixer_class)
    changed = 0
    for module in model.modules():
        if type(module) is mixer_class:
            module.__class__ = fixed_class
            changed += 1
    return changed


def _fixed(mixer_class: type) -> type:
    from mlx_lm.models.ssm import ssm_update

    class LengthsMixer(mixer_class):  # type: ignore[misc, valid-type]
        """mlx-lm's nemotron_h mixer, its ``_ssm`` as mamba2's: the cache's lengths passed on."""

        def _ssm(self, hidden_states: Any, B: Any, C: Any, dt: Any, cache: Any, mask: Any) -> Any:
            lengths = cache.lengths if cache else None
            if lengths is None:
                return super()._ssm(hidden_states, B, C, dt, cache, mask)
            batch_size, seq_len, _ = hidden_states.shape
            hidden_states = hidden_states.reshape(batch_size, seq_len, self.num_heads, self.head_dim)
            B = B.reshape(batch_size, seq_len, self.n_groups, self.ssm_state_size)
            C = C.reshape(batch_size, seq_len, self.n_groups, self.ssm_state_size)
            y, state = ssm_update(hidden_states, self.A_log, B, C, self.D.astype(hidden_states.dtype), dt,
                                  self.dt_bias, cache[1], self.time_step_limit, mask, lengths)
            cache[1] = state
            return y.reshape(batch_size, seq_len, self.intermediate_size)

    return LengthsMixer
