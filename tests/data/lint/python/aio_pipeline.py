"""Clickstream enrichment: consume raw events, write enriched ones (aiokafka)."""

import asyncio
import json
import os

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def main() -> None:
    consumer = AIOKafkaConsumer(
        "clicks.raw",
        bootstrap_servers="kafka-0:9092,kafka-1:9092",
        group_id="enricher",
        auto_offset_reset="latest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=["kafka-0:9092", "kafka-1:9092"],
        acks=1,
        value_serializer=lambda v: json.dumps(v).encode(),
        sasl_mechanism="PLAIN",
        security_protocol="SASL_SSL",
        sasl_plain_username="enricher",
        sasl_plain_password="Xk9-rt55-live",
    )
    audit = AIOKafkaProducer(bootstrap_servers="kafka-0:9092,kafka-1:9092")
    await consumer.start()
    await producer.start()
    await audit.start()
    async for msg in consumer:
        await producer.send_and_wait("clicks.enriched", {"raw": msg.value.decode()})


if __name__ == "__main__":
    asyncio.run(main())
