"""Host lists in store URLs, shared by the Sentinel and the Cluster stores."""

from __future__ import annotations

from urllib.parse import unquote


class URLProblem(ValueError):
    """A malformed sentinel or cluster URL (the factory turns it into StoreURLError)."""


def parse_hosts(netloc: str, default_port: int) -> tuple[list[tuple[str, int]], str, str]:
    """`[user[:password]@]host1:port1,host2:port2` -> ([(host, port)], user, password).

    Hosts may be IPv6 literals in brackets (`[::1]:7000`); user and password are
    percent-decoded.
    """
    userinfo, _, hostlist = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts = []
    for part in hostlist.split(","):
        item = part.strip()
        if not item:
            raise URLProblem("empty host in the host list")
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        elif ":" in item:
            raise URLProblem(f"IPv6 hosts need brackets: [{item}]")
        else:
            host, port_text = item, ""
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise URLProblem(f"bad port {port_text!r} for host {host!r}") from None
        if not host or not 0 < port < 65_536:
            raise URLProblem(f"bad host {item!r}")
        hosts.append((host, port))
    return hosts, unquote(user), unquote(password)
