"""The Anthropic Messages surface (/v1/messages, /v1/messages/count_tokens):
request bodies, answers, stream events, error bodies, routes."""
