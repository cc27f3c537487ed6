"""Which requests are idempotent operations, and which operation (biz_type)
each is: a table of (method, path template) -> Route, or your own function."""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional, Union

from .policy import Route, RouteLike, as_route

RouteTable = Mapping[tuple[str, str], RouteLike]
RouteResolver = Callable[[str, str], Optional[Route]]  # (method, path) -> Route or None


def _template(path: str) -> "re.Pattern[str]":
    # "/orders/{order_id}/refunds" -> one path segment per {name}
    parts = re.split(r"(\{[^/{}]+\})", path)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


def resolver(routes: Union[RouteTable, RouteResolver]) -> RouteResolver:
    """A function (method, path) -> Route from a table such as
    {("POST", "/orders"): "orders.create",
     ("POST", "/orders/{id}/refunds"): Route("refunds.create", wait=False)}."""
    if callable(routes):
        return routes
    table = [(m.upper(), _template(p), as_route(r)) for (m, p), r in routes.items()]

    def resolve(method: str, path: str) -> Optional[Route]:
        for m, pattern, route in table:
            if m == method.upper() and pattern.fullmatch(path):
                return route
        return None

    return resolve
