"""What each embedding route does with each field of its body (docs/EMBEDDINGS.md's table, checked
by tests/test_server_fields.py): honoured, refused (a 400 naming it) or ignored."""

from __future__ import annotations

FIELDS: dict[str, dict[str, str]] = {
    "/v1/embeddings": {"input": "honoured", "model": "honoured", "encoding_format": "honoured",
                       "dimensions": "refused", "user": "ignored"},
    "/embedding": {"input": "honoured", "content": "honoured", "embd_normalize": "honoured", "model": "honoured"},
    "/api/embed": {"model": "honoured", "input": "honoured", "truncate": "honoured", "dimensions": "refused",
                   "options": "refused", "keep_alive": "ignored"},
    "/api/embeddings": {"model": "honoured", "prompt": "honoured", "options": "refused", "keep_alive": "ignored"},
}
