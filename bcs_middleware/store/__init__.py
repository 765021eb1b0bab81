"""The store: SQLAlchemy-backed records (SQLite default, PostgreSQL/MySQL by URL)."""
