"""Constraint -> llguidance matcher, per model, with a bounded cache of compiled grammars.

The llguidance tokenizer (the model's vocabulary as byte strings) costs
10-350 ms to build, so it is built once per model, on first use. A compiled
grammar is kept as a pristine matcher; each request gets a deep copy, which
is much cheaper than compiling again for a large schema.

Whitespace inside JSON is never flexible: a weak or random model, given the
choice, writes spaces until ``max_tokens`` (see docs/tools.md). A client may
still opt in through the schema's own ``x-guidance`` options.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import Any

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest
from mlxd.grammar.processor import clipped

log = logging.getLogger(__name__)

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar for ``constraint``; raises BadRequest for a malformed one."""
    from llguidance import LLMatcher

    if constraint.kind == "json_schema":
        try:
            schema = json.loads(constraint.text)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"The JSON schema is not valid JSON: {exc}", param=constraint.param or "response_format") from exc
        if not isinstance(schema, (dict, bool)):
            raise BadRequest("The JSON schema must be an object.", param=constraint.param or "response_format")
        try:
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise BadRequest(f"The JSON schema cannot be used: {exc}", param=constraint.param or "response_format") from exc
    if constraint.kind == "lark":
        return LLMatcher.grammar_from_lark(constraint.text)
    raise BadRequest(f"Unknown constraint kind `{constraint.kind}`.")


class GrammarCompiler:
    """One model's grammars. Thread-safe; compiling releases the GIL."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, max_grammars: int = 64) -> None:
        # mlx-lm's TokenizerWrapper: llguidance needs the Hugging Face
        # tokenizer inside it, and mlx-lm's EOS ids (config.json may list
        # more than the tokenizer's own eos_token).
        self._wrapper = tokenizer
        self._vocab_size = vocab_size
        self._max = max(1, max_grammars)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._grammars: OrderedDict[Constraint, Any] = OrderedDict()
        # Grammars whose output was seen leaving them (logged once each).
        self._left: OrderedDict[Constraint, None] = OrderedDict()
        self.hits = 0
        self.compiled = 0

    @property
    def eos_token_ids(self) -> list[int]:
        return sorted(getattr(self._wrapper, "eos_token_ids", None) or ())

    @property
    def mask_size(self) -> int:
        """Tokens in a matcher's mask: the llguidance vocabulary, which covers
        the model's logits and every id the tokenizer has."""
        return int(self.ll_tokenizer().vocab_size)

    def ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                hf = getattr(self._wrapper, "_tokenizer", self._wrapper)
                size = max(self._vocab_size, len(hf))
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    hf, n_vocab=size, eos_token=self.eos_token_ids or None
                )
            return self._ll_tokenizer

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher at the start of ``constraint``'s grammar; raises
        BadRequest naming the problem when the grammar does not compile."""
        with self._lock:
            pristine = self._grammars.get(constraint)
            if pristine is not None:
                self._grammars.move_to_end(constraint)
                self.hits += 1
                return pristine.deep_copy()
        pristine = self._compile(constraint)
        with self._lock:
            self._grammars[constraint] = pristine
            self._grammars.move_to_end(constraint)
            while len(self._grammars) > self._max:
                self._grammars.popitem(last=False)
            self.compiled += 1
        return pristine.deep_copy()

    def _compile(self, constraint: Constraint) -> Any:
        from llguidance import LLMatcher

        grammar = grammar_text(constraint)
        matcher = LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            what = "JSON schema" if constraint.kind == "json_schema" else "grammar"
            raise BadRequest(
                f"The {what} cannot be compiled: {clipped(matcher.get_error())}",
                param=constraint.param or ("response_format" if constraint.kind == "json_schema" else "tools"),
            )
        return matcher

    def report_failure(self, constraint: Constraint, why: str) -> None:
        """An output left ``constraint``'s grammar (should not happen: the
        sampler sees only allowed tokens): one clipped line, the first time
        per grammar; a client repeating the request does not repeat the log."""
        with self._lock:
            seen = constraint in self._left
            self._left[constraint] = None
            self._left.move_to_end(constraint)
            while len(self._left) > self._max:
                self._left.popitem(last=False)
        if seen:
            log.debug("constrained decoding left its grammar again: %s", clipped(why))
        else:
            log.warning("constrained decoding left its grammar: %s", clipped(why))

    def stats(self) -> dict[str, int]:
        return {"grammars": len(self._grammars), "compiled": self.compiled, "hits": self.hits}

