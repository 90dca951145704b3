"""OpenAI's Responses API: /v1/responses, and GET/DELETE /v1/responses/{id} of the responses kept in memory."""
