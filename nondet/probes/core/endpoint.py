"""A server's base URL as --endpoint / --against take it: checked when the config is, compared as a deployment.

urllib only finds a bad port when the first connection is made (ValueError: an internal error after
the run directory was opened), so the whole URL is checked with the other flags: a usage error
naming the flag. Two URLs name one deployment when they differ only where the client ignores the
difference (a trailing slash or /v1, the host's case, an explicit default port); `--against` with
the --endpoint deployment would compare a server with itself, as `nondet compare A A` would.
"""

from dataclasses import dataclass
from urllib.parse import urlsplit

from nondet.errors import UsageError

DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Endpoint:
    scheme: str  # http | https
    host: str  # lower case (as urllib gives it)
    port: int | None  # None = the scheme's default
    base: str  # path the API paths (/v1/...) go under, without a trailing / or /v1

    def deployment(self) -> tuple[str, str, int, str]:
        """What two URLs of the same server share."""
        return self.scheme, self.host, self.port or DEFAULT_PORTS[self.scheme], self.base


def parse_endpoint(url: str, flag: str = "--endpoint") -> Endpoint:
    """The URL's parts; a UsageError naming `flag` where it is no http(s) URL or its port is none."""
    try:
        parts = urlsplit(url.rstrip("/"))
    except ValueError:  # e.g. an IPv6 host without its closing ]
        parts = None
    if parts is None or parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise UsageError(f"{flag} must be an http(s) URL like http://127.0.0.1:8000, not {url!r}")
    port = _port(parts)
    if port == 0:
        raise UsageError(f"{flag} {url!r}: the port must be a number from 1 to 65535")
    base = parts.path[:-3] if parts.path.endswith("/v1") else parts.path
    return Endpoint(parts.scheme, parts.hostname, port, base)


def _port(parts) -> int | None:
    """The URL's port; 0 (never connectable) for one out of range or not a number, which urllib raises for."""
    try:
        return parts.port
    except ValueError:
        return 0


def refuse_same_deployment(endpoint: str, against: str) -> None:
    """--against naming the --endpoint deployment itself: a usage error."""
    if parse_endpoint(endpoint).deployment() == parse_endpoint(against, "--against").deployment():
        raise UsageError(f"--against {against} is the --endpoint deployment {endpoint}: it would be compared with "
                         "itself; give the URL of a second deployment")
