"""`mlxcel-py serve`: the OpenAI-compatible HTTP server (see docs/SERVER.md)."""

from __future__ import annotations

from ..errors import MlxcelError
from ..flags import ServeFlags
from .common import fail, resolve_or_exit
from .parse import parses


@parses(ServeFlags)
def serve(flags: ServeFlags) -> None:
    """Serve the model (or several) over HTTP: the OpenAI, llama-server and Anthropic APIs (see docs/SERVER.md)."""
    cfg = resolve_or_exit("serve", flags)
    # Imported here: the server pulls in MLX, which must load after the BLAS preload.
    from ..server.http.serving import serve_forever

    try:
        serve_forever(cfg)
    except MlxcelError as exc:  # ModelLoadError, ServeError (port in use), ConfigError (MLXCEL_BLAS)
        fail(str(exc))
