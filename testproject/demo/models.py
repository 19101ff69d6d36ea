from django.db import models


class Product(models.Model):
    """A product imported from a supplier's catalogue."""

    supplier = models.IntegerField()
    sku = models.CharField(max_length=32)
    name = models.CharField(max_length=200)
    price_cents = models.IntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["supplier", "sku"], name="demo_one_product_per_sku")]

    def __str__(self) -> str:
        return f"{self.supplier}/{self.sku}"


class Outage(models.Model):
    """A page the fake upstream failed to serve, and how many times it did."""

    supplier = models.IntegerField()
    page_after = models.IntegerField()
    failures = models.IntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["supplier", "page_after"], name="demo_one_outage_per_page")]

    def __str__(self) -> str:
        return f"supplier {self.supplier} after {self.page_after}: {self.failures} failure(s)"
