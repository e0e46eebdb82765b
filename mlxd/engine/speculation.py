"""One text engine's speculative decoding: its method, the draft model it
loaded with, the governor that turns it off and on, and the figures
/v1/status and /metrics show. It outlives the batch generators it builds
(``engine/batch.py`` drops its generator whenever the batch runs empty), so
the rolling window and the counts span them."""

from __future__ import annotations

from typing import Any

from mlxd.engine.speculative_batch import SpeculativeGenerator
from mlxd.engine.speculative_core import SpecStats
from mlxd.engine.speculative_drafters import DraftModel, PromptLookup
from mlxd.engine.speculative_governor import Governor
from mlxd.registry.model import SpeculativeSpec


class Speculation:
    def __init__(self, spec: SpeculativeSpec, draft_model: Any = None, *, prefill_chunk: int = 512,
                 unsupported: str | None = None) -> None:
        self.method = spec.method
        self.tokens = spec.tokens
        self.draft_model = draft_model
        self.governor = Governor(hold_on=not spec.auto_off)
        self.stats = SpecStats()
        self._chunk = prefill_chunk
        # Why this model cannot speculate (a cache it cannot roll back); None: it can.
        self.unsupported = unsupported

    @property
    def usable(self) -> bool:
        return self.unsupported is None

    def generator(self, model: Any) -> SpeculativeGenerator:
        """Worker thread: a batch generator that speculates."""
        if self.method == "draft":
            if self.draft_model is None:
                raise RuntimeError("the draft model was released")
            drafter: Any = DraftModel(self.draft_model, self._chunk)
        else:
            drafter = PromptLookup(self.tokens)
        return SpeculativeGenerator(model, drafter, self.tokens, self.governor, self.stats)

    def drop(self) -> None:
        self.draft_model = None

    def status(self) -> dict[str, Any]:
        """``speculative:`` under the model in /v1/status (docs/status.md)."""
        s = self.stats
        return {
            "method": self.method,
            "tokens": self.tokens,
            "acceptance_rate": s.acceptance_rate,
            "accepted_per_step": s.accepted_per_step,
            "speedup": self.governor.speedup,
            "active": self.usable and self.governor.active,
            "unsupported": self.unsupported,
            "verify_steps": s.steps,
            "drafted_tokens": s.drafted,
            "accepted_tokens": s.accepted,
        }
