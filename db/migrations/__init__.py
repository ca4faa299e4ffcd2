"""Alembic migrations of the store, shipped inside the package (run by db.migrate, no alembic.ini)."""
