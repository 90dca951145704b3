"""Anthropic's Messages API: /v1/messages, /v1/messages/count_tokens (its errors in Anthropic's shape)."""
