"""Running under gunicorn: the gevent and gthread workers, the server hooks and the data directory."""
