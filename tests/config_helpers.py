"""Config helpers only the tests use."""

import mlxcel_py.config_chunk as config_module
from mlxcel_py.flags import GenerateFlags, RunFlags, ServeFlags, build, leaves


def reset_prefill_chunk_override() -> None:
    """Forget the MLXCEL_PREFILL_CHUNK that config_chunk.py reads once per process."""
    config_module._override = config_module._UNREAD


_RECORDS = {"generate": GenerateFlags, "run": RunFlags}


def flags_for(command: str, **values):
    """The flag record `command` parses, holding `values` by option name (as the record's fields are
    named); where a value is one that command has no option for, a ServeFlags (every flag resolve
    reads), so the tests can show resolve refusing a serve flag elsewhere. `extra_models` are serve's
    -m after the first."""
    extra = tuple(values.pop("extra_models", ()))
    if extra or command not in _RECORDS:
        first = values.pop("model", None)
        values["model"] = ((first,) if isinstance(first, str) else tuple(first or ())) + extra
    kind = _RECORDS.get(command, ServeFlags)
    names = {name for name, _, _ in leaves(kind)}
    if not set(values) <= names:
        kind = ServeFlags
        if isinstance(values.get("model"), str):
            values["model"] = (values["model"],)
    unknown = set(values) - {name for name, _, _ in leaves(ServeFlags)}
    assert not unknown, f"no such flag: {sorted(unknown)}"
    return build(kind, values)
