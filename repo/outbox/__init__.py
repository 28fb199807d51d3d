"""The resilient write path: :class:`~.writer.TranscriptWriter` appends to the primary store
and, when it cannot, parks the batch in the pending outbox (:mod:`.table`), replayed in
order by its drainer. The protocol (park, claim, complete, fail, dead) lives here and only
here; it builds on :mod:`sessionrepo.store`.
"""
