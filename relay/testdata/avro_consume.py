"""Reads Avro records as an outside consumer would: Confluent's Python client
(librdkafka, read_committed) and its AvroDeserializer, which fetches the
writer's schema by the id in the record from the registry's Confluent API.
Prints one JSON line per record: {"id", "key", "partition", "value"}.

usage: avro_consume.py BROKERS REGISTRY_URL TOPIC COUNT
"""
import base64
import decimal
import json
import sys
import time

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def plain(v):
    if isinstance(v, bytes):
        return {"bytes": base64.b64encode(v).decode()}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    raise TypeError(f"cannot print {type(v)}")


def main():
    brokers, registry, topic, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"avro-consume-{topic}-{time.time_ns()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.subscribe([topic])
    deadline = time.monotonic() + 90
    seen = 0
    try:
        while seen < count:
            if time.monotonic() > deadline:
                sys.exit(f"{seen} of {count} records read from {topic} in 90 s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                sys.exit(f"consume {topic}: {msg.error()}")
            value = deserialize(msg.value(), SerializationContext(topic, MessageField.VALUE))
            headers = dict(msg.headers() or [])
            print(json.dumps({
                "id": headers.get("id", b"").decode(),
                "key": msg.key().decode() if msg.key() is not None else None,
                "partition": msg.partition(),
                "value": value,
            }, default=plain, ensure_ascii=False), flush=True)
            seen += 1
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
