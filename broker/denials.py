"""Permission violations the server reports on a connection, and the requests they end.

A publish or a subscription the server's permissions refuse is not answered: the server
reports it asynchronously (nats-py hands that to the connection's error callback). ``Denials``
keeps those reports, so a request in flight ends at once with ``PermissionDenied`` instead of
a timeout, and a caller can ask whether a subscription was refused.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["Denials"]

_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription)(?: with reply of| to) "(.*)"', re.I
)
_RECENT_DENIALS = 256


class Denials:
    """Permission violations the server reported on one connection.

    A refused publish does not close the connection: the server sends an asynchronous
    ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (lower-cased by nats-py) and
    never answers the request. Requests in flight register here by subject, so a violation
    for their subject ends them at once with ``PermissionDenied`` instead of a timeout.
    """

    def __init__(self) -> None:
        self.recent: OrderedDict[str, float] = OrderedDict()
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def report(self, text: str) -> bool:
        """Record a violation; ``False`` if ``text`` is not one."""
        m = _VIOLATION.search(text)
        if m is None:
            return False
        key = m[2].lower()
        self.recent[key] = time.monotonic()
        self.recent.move_to_end(key)
        while len(self.recent) > _RECENT_DENIALS:
            self.recent.popitem(last=False)
        for on_denied in list(self.waiting.get(key, ())):
            on_denied()
        return True

    def since(self, subject: str, started: float) -> bool:
        """Whether a violation for ``subject`` was reported at or after ``started``."""
        at = self.recent.get(subject.lower())
        return at is not None and at >= started

    def watch(self, subject: str, on_denied: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_denied`` if ``subject`` is refused; returns the function that stops it."""
        key = subject.lower()
        waiting = self.waiting.setdefault(key, [])
        waiting.append(on_denied)

        def stop() -> None:
            waiting.remove(on_denied)
            if not waiting and self.waiting.get(key) is waiting:
                del self.waiting[key]

        return stop
