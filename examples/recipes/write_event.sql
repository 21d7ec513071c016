-- The business change and its event in one transaction: both commit, or
-- neither does. The connector publishes the outbox row to the topic
-- outbox.event.order, keyed by the aggregate id, with the header id.
BEGIN;
INSERT INTO orders (id, customer, total_cents) VALUES ('o-1001', 'ada', 2599);
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(),  -- the event id (uuid); consumers deduplicate by it
        'order',            -- the topic: outbox.event.order
        'o-1001',           -- the record key: one aggregate's events stay in order
        'OrderPlaced',      -- the event type
        '{"orderId": "o-1001", "customer": "ada", "totalCents": 2599}');  -- jsonb
COMMIT;
