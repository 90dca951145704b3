"""Ollama's native API: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version (its errors in Ollama's shape)."""
