"""What ``sessionrepo doctor`` reports: one finding per check.

Here, at the bottom of the layers, because the backends judge their own settings
(:meth:`sessionrepo.dialects.base.BackendDialect.judge_settings`) and the operator tools
above them collect the findings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

CheckStatus = Literal["ok", "warn", "fail", "skip"]


class Check(BaseModel):
    """One finding of ``doctor``."""

    model_config = ConfigDict(frozen=True)

    name: str
    status: CheckStatus
    detail: str
    #: What to do about a ``warn`` or ``fail``.
    fix: str | None = None
