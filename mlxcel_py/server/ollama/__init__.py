"""Ollama's native API: /api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version
(routes, schemas, prepare, shapes, fields, catalog; its errors in Ollama's shape)."""
