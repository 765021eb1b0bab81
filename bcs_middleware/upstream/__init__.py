"""The streaming upstream proxy (terminal app) and the transport that owns upstream connections."""
