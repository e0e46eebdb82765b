"""Tool calling: which call format a model writes, splitting it out of the text, forcing a call.

- ``formats``: the model's tool-call format (mlx-lm's own parsers, chosen the
  way mlx-lm chooses them, or the registry's ``tool_parser:``);
- ``splitter``: text deltas in, text deltas and tool-call events out (streaming
  and whole answers);
- ``forcing``: the grammar that makes a model write a call (``tool_choice``
  ``required`` or a named function) with schema-valid arguments;
- ``output_specs`` / ``output_request``: a request's tools, tool choice and
  response format as typed values, parsed once by each surface;
- ``output_plan``: those checked and turned into what the engine request carries.
"""
