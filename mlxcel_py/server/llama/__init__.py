"""llama-server's own API: /completion, /props, /apply-template, /tokenize, /detokenize."""
