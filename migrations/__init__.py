"""Alembic migrations of the ledger, shipped inside the package as `campaign.migrations`."""
