"""Every difference between the Python and library versions genready supports, in one place.

Supported: Python 3.10-3.13 and aiohttp >= 3.8 (Debian 12 ships 3.8.4, Ubuntu 22.04 runs Python 3.10).
The rest of the package imports these names instead of the version-specific spelling; ruff's
banned-api list in pyproject.toml points each forbidden spelling here.
"""

from __future__ import annotations

import datetime
import enum
import sys
from typing import TYPE_CHECKING, Any

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

__all__ = ["TIMEOUT_ERRORS", "UTC", "AppRunner", "StrEnum", "app_key", "sock_site", "tcp_site", "timeout",
           "tomllib", "wait_for"]

UTC = datetime.timezone.utc  # datetime.UTC is 3.11+

class StrEnum(str, enum.Enum):
    """enum.StrEnum (3.11+) for 3.10 too: a member is its value in str(), f-strings and format().
    The same class on every version, so that behaviour cannot differ between them."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[Any]) -> str:
        return name.lower()  # what enum.StrEnum gives auto()


# The asyncio and aiohttp differences live in _compat_async.py and load on first use: importing
# asyncio and aiohttp costs ~0.2 s, and the CLI (`genready wait` in a unit's ExecCondition=,
# through config's tomllib) must not pay it. Import them from here as usual.
if TYPE_CHECKING:
    from genready._compat_async import TIMEOUT_ERRORS, AppRunner, app_key, sock_site, tcp_site, timeout, wait_for

_ASYNC: frozenset[str] = frozenset({"AIOHTTP_VERSION", "TIMEOUT_ERRORS", "AppRunner", "app_key", "sock_site",
                                    "tcp_site", "timeout", "wait_for"})


def __getattr__(name: str) -> Any:
    if name in _ASYNC:
        from genready import _compat_async

        return getattr(_compat_async, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
