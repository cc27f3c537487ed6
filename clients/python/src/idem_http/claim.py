"""The claim as an object: what idem_claim answered, and the calls that
finish it. Shared by the sync and async APIs (which differ only in how they
run a statement)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any, Optional

from .errors import ClaimNotFinished
from .policy import Response


@dataclass
class ClaimState:
    key: str
    biz_type: str
    claimed: bool
    state: str
    result: Any
    lease: Optional[str] = None
    finished: Optional[str] = field(default=None)  # "completed" / "failed" once stored
    expires_at: Optional[datetime] = None  # the claim's expiry, as idem_claim answered it

    @property
    def expires(self) -> Optional[str]:
        """The claim's expiry as an HTTP-date (IMF-fixdate), for the
        Idempotent-Expires header of a replay."""
        if not isinstance(self.expires_at, datetime):
            return None
        return format_datetime(self.expires_at.astimezone(timezone.utc), usegmt=True)

    def check_finished(self) -> None:
        """At the end of a claim's block: a claim made and neither completed
        nor failed is a mistake (its answer could not be replayed)."""
        if not self.claimed or self.finished is not None:
            return
        if self.lease:
            raise ClaimNotFinished(f"leased claim ({self.biz_type}, {self.key}) neither completed nor failed; "
                                   "its lease was handed back (idem_release): a retry takes over at once")
        raise ClaimNotFinished(f"claim ({self.biz_type}, {self.key}) neither completed nor failed: rolled back")

    @property
    def lease_token(self) -> Optional[str]:
        """The lease's token (lease mode, claimed): the proof of ownership
        that idem_complete / idem_fail / idem_checkpoint need."""
        if self.lease and self.claimed and isinstance(self.result, dict):
            tok = self.result.get("lease_token")
            return tok if isinstance(tok, str) else None
        return None

    @property
    def attempt(self) -> int:
        """1 for a first claim; 2, 3, … after a lease that ran out was taken
        over, or a stored failure is retried (the type's on_failure 'retry')."""
        attempt = self.result.get("attempt") if self.claimed and isinstance(self.result, dict) else None
        return attempt if isinstance(attempt, int) else 1

    @property
    def recovery_point(self) -> Optional[str]:
        """The last checkpoint's name recorded by a previous attempt (lease takeover)."""
        if self.claimed and isinstance(self.result, dict):
            p = self.result.get("recovery_point")
            return p if isinstance(p, str) else None
        return None

    @property
    def recovery_data(self) -> Any:
        """The data of the last checkpoint of a previous attempt (lease takeover)."""
        if self.claimed and isinstance(self.result, dict):
            return self.result.get("recovery_data")
        return None

    @property
    def replay(self) -> Optional[Response]:
        """The stored response of a completed or failed claim, if it is one
        this library stored."""
        if self.claimed or self.state not in ("completed", "failed"):
            return None
        return Response.from_document(self.result)
