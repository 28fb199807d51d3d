"""The asyncio API: the sync classes' own logic, each awaited method derived from its sync
method (see :mod:`sessionrepo.store.bridge` for how a sync call runs on the loop)."""
