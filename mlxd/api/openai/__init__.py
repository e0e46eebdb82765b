"""The OpenAI-compatible surface: request bodies, answers, stream frames, error bodies, routes."""
