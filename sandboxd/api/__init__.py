"""The HTTP API (FastAPI): routes, authentication, problem+json errors."""
