"""sessionrepo.dialects.sqlalchemy_compat: the installed SQLAlchemy has the pool private
the shim uses, and it still does what the store needs on a lost server: the connection
and every older one are replaced."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.pool import Pool, QueuePool

from sessionrepo.dialects.sqlalchemy_compat import REQUIRED, invalidate_generation


def test_the_installed_sqlalchemy_has_what_the_shim_uses() -> None:
    assert [name for name in REQUIRED if not hasattr(Pool, name)] == []


def test_the_connection_and_every_older_one_are_replaced(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}", poolclass=QueuePool, pool_size=2)
    try:
        lost, older = engine.raw_connection(), engine.raw_connection()
        older_driver = older.driver_connection
        older.close()  # back in the pool, idle
        invalidate_generation(engine.pool, lost, ConnectionError("server restarted"))
        assert not lost.is_valid
        lost.close()
        first, second = engine.raw_connection(), engine.raw_connection()
        # Neither checkout hands back the idle connection made before the loss.
        assert older_driver not in (first.driver_connection, second.driver_connection)
        first.close()
        second.close()
    finally:
        engine.dispose()
