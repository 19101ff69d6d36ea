"""A fake external catalogue: 10 000 products a supplier serves page by page.

It stands in for somebody else's API: pages by an opaque "after" token, and one
page per supplier fails once with a connection error, as a flaky upstream does.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from .models import Outage

TOTAL = 10_000
FLAKY_AFTER = TOTAL // 2


class UpstreamUnavailable(ConnectionError):
    pass


def fetch_page(supplier: int, *, after: int | None, size: int) -> dict[str, Any]:
    start = 0 if after is None else after
    if start == FLAKY_AFTER:
        try:
            with transaction.atomic():
                Outage.objects.create(supplier=supplier, page_after=start)
        except IntegrityError:
            pass  # it failed once already; this time it answers
        else:
            raise UpstreamUnavailable(f"supplier {supplier}: connection reset while reading the page after {start}")
    end = min(TOTAL, start + size)
    items = [
        {"sku": f"S{supplier}-{n:05d}", "name": f"Product {n} of supplier {supplier}", "price_cents": 100 + n % 900}
        for n in range(start, end)
    ]
    return {"items": items, "next": end if end < TOTAL else None, "total": TOTAL}
