"""The ledger: the database of record (SQLite by default, Postgres by URL).

Rows in `models`; read models in `reads`; units of work that change it in `writes`;
opening and migrations in `db` and `schema`.
Only the driver writes it; trainers and supervisors write files it ingests.
"""

from campaign.ledger.db import Ledger, default_url, open_ledger

__all__ = ["Ledger", "default_url", "open_ledger"]
