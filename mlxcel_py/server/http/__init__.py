"""The HTTP plumbing every dialect shares: auth, CORS, bodies, errors, OpenAPI, metrics, serving, cluster."""
