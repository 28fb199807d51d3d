"""Usage as a framework reports it: a record when its counts make one, else a warning.

What a framework puts in its usage fields is the framework's (a model's response, a
provider's metadata): a count past :data:`sessionrepo.models.usage.MAX_TOKENS`, a
negative one, or a provider name that is not text would make
:class:`~sessionrepo.models.Usage` refuse it. The adapters then store the messages
anyway and leave that one usage record out, saying so in one WARNING line (the fields
and why, never the content): a transcript is never refused for its accounting.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from sessionrepo.models.usage import Usage

log = logging.getLogger("sessionrepo")


def reported_usage(where: str, **fields: Any) -> Usage | None:
    """``Usage(**fields)``, or ``None`` (logged) when the reported values cannot be one;
    ``where`` names the adapter and the message for the log line."""
    try:
        return Usage(**fields)
    except ValidationError as exc:
        reasons = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            for error in exc.errors()
        )
        log.warning("%s: the reported usage was not recorded (%s)", where, reasons)
        return None
