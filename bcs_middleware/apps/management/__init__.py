"""The management REST API (users, tokens, clusters, credentials, permissions): one function per endpoint."""
