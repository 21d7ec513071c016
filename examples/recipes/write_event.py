"""Writes an order and its OrderPlaced event in one transaction (psycopg 3).

    OUTBOX_PG_DSN=postgres://... python write_event.py o-1002 grace 1299
"""
import os
import sys

import psycopg
from psycopg.types.json import Jsonb


def place_order(conn, order_id, customer, total_cents):
    """Commits the order and its event together, or neither; returns the event id."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO orders (id, customer, total_cents) VALUES (%s, %s, %s)",
            (order_id, customer, total_cents),
        )
        (event_id,) = conn.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)"
            " VALUES (gen_random_uuid(), %s, %s, %s, %s) RETURNING id",
            ("order", order_id, "OrderPlaced",
             Jsonb({"orderId": order_id, "customer": customer, "totalCents": total_cents})),
        ).fetchone()
    return event_id


if __name__ == "__main__":
    order_id, customer, total_cents = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with psycopg.connect(os.environ["OUTBOX_PG_DSN"], autocommit=True) as conn:
        print(place_order(conn, order_id, customer, total_cents))
