"""The demo's job: import a supplier's whole catalogue, one page per pass."""

from __future__ import annotations

from typing import Any

from django_jobruns import RetryPolicy, job

from . import catalogue
from .models import Product


def save_products(supplier: int, items: list[dict[str, Any]]) -> int:
    Product.objects.bulk_create(
        [Product(supplier=supplier, **item) for item in items],
        update_conflicts=True,
        unique_fields=["supplier", "sku"],
        update_fields=["name", "price_cents"],
    )
    return len(items)


@job(retry=RetryPolicy(max_attempts=5, base_delay=0.2, max_delay=5))
def import_catalog(p: Any) -> dict[str, Any]:
    supplier = p.payload["supplier"]
    size = p.payload.get("page_size", 500)
    after = p.cursor
    outage = {k: p.payload[k] for k in ("down_at", "down_for") if k in p.payload}
    page = p.step(f"fetch:{after}", lambda: catalogue.fetch_page(supplier, after=after, size=size, **outage))
    saved = p.step(f"save:{after}", lambda: save_products(supplier, page["items"]))
    if after is None:
        p.count("total", page["total"])
    p.count("imported", saved)
    return {"done": True} if page["next"] is None else {"cursor": page["next"]}
