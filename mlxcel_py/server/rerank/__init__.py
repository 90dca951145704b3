"""The reranking routes: llama-server's /rerank (Jina's and Cohere's shapes) and TEI's."""
