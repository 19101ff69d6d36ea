"""A fake external catalogue: 10 000 products a supplier serves page by page.

It stands in for somebody else's API: pages by an opaque "after" token, and it
goes down at one page for a while -- once by default, which a retry absorbs, or
``down_for`` times in a row, which exhausts the job's retry policy and leaves a
failed run for an operator to resume.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .models import Outage

TOTAL = 10_000
FLAKY_AFTER = TOTAL // 2


class UpstreamUnavailable(ConnectionError):
    pass


def fetch_page(
    supplier: int, *, after: int | None, size: int, down_at: int = FLAKY_AFTER, down_for: int = 1
) -> dict[str, Any]:
    start = 0 if after is None else after
    if start == down_at:
        with transaction.atomic():
            outage, _ = Outage.objects.select_for_update().get_or_create(supplier=supplier, page_after=start)
            if outage.failures < down_for:
                outage.failures += 1
                outage.save(update_fields=["failures"])
                failed = outage.failures
            else:
                failed = 0
        if failed:
            raise UpstreamUnavailable(
                f"supplier {supplier}: connection reset while reading the page after {start} "
                f"(outage {failed}/{down_for})"
            )
    end = min(TOTAL, start + size)
    items = [
        {"sku": f"S{supplier}-{n:05d}", "name": f"Product {n} of supplier {supplier}", "price_cents": 100 + n % 900}
        for n in range(start, end)
    ]
    return {"items": items, "next": end if end < TOTAL else None, "total": TOTAL}
