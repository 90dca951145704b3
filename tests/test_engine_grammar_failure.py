"""A grammar that fails mid-generation (one of llguidance's limits) ends its own request with
an error; the other sequences of the batch carry on exactly as they would alone."""

from mlxcel_py.config import resolve
from mlxcel_py.engine import Finished, PromptProgress, Request, SamplingParams, TokenDelta, build_engine
from mlxcel_py.engine.core.request import ConstraintSpec

from config_helpers import flags_for
from tiny import tiny_model

# Compiles, but its forced prefix exceeds llguidance's item limit at the first token.
TOO_BIG = ConstraintSpec("gbnf", 'root ::= "a"{50000}')


def run(requests):
    engine = build_engine(resolve("serve", flags_for("serve", parallel=4), env={}).engine, tiny_model())
    for r in requests:
        engine.add_request(r)
    events = {r.request_id: [] for r in requests}
    for _ in range(1000):
        if not engine.has_work():
            return events
        for e in engine.step():
            events[e.request_id].append(e)
    raise AssertionError("the engine did not finish")


def test_a_failing_grammar_ends_its_request_and_spares_the_batch():
    plain = Request("plain", tuple(range(5, 25)), SamplingParams(max_tokens=12, ignore_eos=True))
    alone = run([plain])["plain"]
    events = run([plain, Request("bad", tuple(range(30, 40)), SamplingParams(max_tokens=8, constraint=TOO_BIG))])
    (end,) = [e for e in events["bad"] if not isinstance(e, PromptProgress)]
    assert isinstance(end, Finished) and end.finish_reason == "error"
    assert end.error.startswith("the grammar failed during generation") and end.usage.completion_tokens == 0
    tokens = lambda evs: [e.token_id for e in evs if isinstance(e, TokenDelta)]  # noqa: E731
    assert tokens(events["plain"]) == tokens(alone) and events["plain"][-1].finish_reason == "length"
