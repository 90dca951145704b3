"""The `mlxcel-py bench` load-test client: admission under live decode, single-stream TTFT, and their reports.

Pure parts (stats, SSE parsing, prompt building, arm parsing, reports) import nothing heavy;
the scenarios talk to servers over loopback HTTP only, so any OpenAI-compatible server can be
measured with the same client."""
