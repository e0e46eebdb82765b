"""The OpenAI Responses surface (/v1/responses): request bodies, response
objects, stream events, the bounded store behind previous_response_id."""
