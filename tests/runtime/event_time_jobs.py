"""The jobs of test_event_time_on_spark.py, in a module of their own: a child driver imports
them by name, and Spark's workers get them by value."""

from __future__ import annotations

from datetime import timedelta

from streamplatform import EmitStrategy, JoinWindows, SlidingWindows, StreamsBuilder, TimeWindows
from streamplatform.serdes import Serdes


def pages_per_minute(clicks: str, sink: str):
    """Per page, clicks per 1-minute window (1 minute of grace), final results only."""
    b = StreamsBuilder()
    (
        b.stream(clicks, Serdes.string(), Serdes.json())
        .group_by(lambda key, value: value["page"], key_serde=Serdes.string())
        .windowed_by(TimeWindows.of_size_and_grace(timedelta(minutes=1), timedelta(minutes=1)))
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .map(lambda window, count: (f"{window.key}@{window.window.start}", count))
        .to(sink, key_serde=Serdes.string(), value_serde=Serdes.long())
    )
    return b.build()


def views_per_sliding_window(views: str, sink: str):
    """Per user, views in each sliding window of 5 minutes (1 minute of grace), final
    results only: the count whose windows wait in memory until the commit (write-back)."""
    b = StreamsBuilder()
    (
        b.stream(views, Serdes.string(), Serdes.json())
        .group_by_key()
        .windowed_by(
            SlidingWindows.of_time_difference_and_grace(timedelta(minutes=5), timedelta(minutes=1))
        )
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .map(lambda window, count: (f"{window.key}@{window.window.start}", count))
        .to(sink, key_serde=Serdes.string(), value_serde=Serdes.long())
    )
    return b.build()


def clicks_after_impressions(impressions: str, clicks: str, sink: str):
    """Each click with the impressions of its key within the 10 minutes before it."""
    b = StreamsBuilder()
    shown = b.stream(impressions, Serdes.string(), Serdes.json())
    clicked = b.stream(clicks, Serdes.string(), Serdes.json())
    windows = JoinWindows.of_time_difference_with_no_grace(timedelta(minutes=10)).after(0)
    clicked.join(shown, lambda c, i: {"click": c["id"], "impression": i["id"]}, windows).to(sink)
    return b.build()


def views_joined_with_buys(views: str, buys: str, sink: str):
    """Three sub-topologies: each stream re-keyed by page, then joined within 10 seconds."""
    b = StreamsBuilder()
    viewed = b.stream(views, Serdes.string(), Serdes.json()).select_key(lambda k, v: v["page"])
    bought = b.stream(buys, Serdes.string(), Serdes.json()).select_key(lambda k, v: v["page"])
    windows = JoinWindows.of_time_difference_with_no_grace(timedelta(seconds=10))
    viewed.join(bought, lambda v, p: {"view": v["n"], "buy": p["n"]}, windows).to(sink)
    return b.build()


def cogrouped_balances(orders: str, refunds: str, sink: str):
    """Per customer, orders minus refunds (KIP-150's cogroup): the orders re-keyed from order
    id to customer (a repartition), the refunds keyed by customer already."""
    b = StreamsBuilder()
    by_customer = b.stream(orders, Serdes.string(), Serdes.json()).group_by(
        lambda order_id, order: order["customer"], key_serde=Serdes.string()
    )
    refunded = b.stream(refunds, Serdes.string(), Serdes.json()).group_by_key()
    balances = (
        by_customer.cogroup(lambda customer, order, total: total + order["amount"])
        .cogroup(refunded, lambda customer, refund, total: total - refund["amount"])
        .aggregate(lambda: 0, value_serde=Serdes.long(), name="balances")
    )
    balances.to_stream().to(sink, value_serde=Serdes.long())
    return b.build()


def orders_at_their_rate(orders: str, rates: str, sink: str):
    """Each order with the rate of its currency valid at its time (a versioned table), waiting
    a 30-second grace for late rate updates (KIP-923)."""
    from streamplatform.state import Stores

    b = StreamsBuilder()
    table = b.table(
        rates,
        Serdes.string(),
        Serdes.json(),
        store=Stores.persistent_versioned_key_value_store("rates", 3_600_000),
    )
    b.stream(orders, Serdes.string(), Serdes.json()).join(
        table,
        lambda order, rate: {"order": order["id"], "rate": rate["rate"]},
        grace=30_000,
        name="priced",
    ).to(sink)
    return b.build()


def orders_with_product_names(orders: str, products: str, sink: str):
    """Each order with its product's name from a global table (no co-partitioning)."""
    b = StreamsBuilder()
    catalog = b.global_table(products, Serdes.string(), Serdes.json())
    b.stream(orders, Serdes.string(), Serdes.json()).join(
        catalog,
        lambda key, order: order["product"],
        lambda order, product: {"order": order["id"], "name": product["name"]},
    ).to(sink)
    return b.build()


def orders_with_customers(orders: str, customers: str, sink: str):
    """Each order with its customer's name: a foreign-key table join (KIP-213)."""
    b = StreamsBuilder()
    customer_table = b.table(customers, Serdes.string(), Serdes.json())
    b.table(orders, Serdes.string(), Serdes.json()).join(
        customer_table,
        lambda order: order["customer"],
        lambda order, customer: {"order": order["id"], "name": customer["name"]},
        name="orders-customers",
    ).to_stream().to(sink)
    return b.build()


def rate_limited_views(views: str, sink: str):
    """Views per page, at most one update per page every 10 s of event time (KIP-328's
    until_time_limit)."""
    from streamplatform import BufferConfig, Suppressed

    b = StreamsBuilder()
    (
        b.stream(views, Serdes.string(), Serdes.json())
        .group_by_key()
        .count()
        .suppress(Suppressed.until_time_limit(timedelta(seconds=10), BufferConfig.unbounded()))
        .to_stream()
        .to(sink, value_serde=Serdes.long())
    )
    return b.build()
