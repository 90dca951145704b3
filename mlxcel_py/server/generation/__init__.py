"""What every dialect shares between its request body and its reply: the body base and sampling
fields (schemas, sampling), prompt ids and limits (prompt), structured output (structured),
`Prepared` and the refused-field mechanism (prepared), submitting and watching (submit), the
streamed response, SSE or NDJSON (stream), the whole-reply collector (collect), and OpenAI-form parts and logprobs
(assembler, logprobs)."""
