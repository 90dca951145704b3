"""Embeddings: OpenAI's /v1/embeddings, llama-server's /embedding, Ollama's /api/embed and /api/embeddings."""
