"""Orders relay (aiokafka) with durable settings and manual commits."""

import os

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def relay() -> None:
    consumer = AIOKafkaConsumer(
        "orders",
        bootstrap_servers="kafka-0:9092,kafka-1:9092,kafka-2:9092",
        group_id="relay",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers="kafka-0:9092,kafka-1:9092,kafka-2:9092",
        enable_idempotence=True,
        sasl_plain_password=os.environ["KAFKA_PASSWORD"],
    )
    await consumer.start()
    await producer.start()
    async for msg in consumer:
        await producer.send_and_wait("orders.copy", msg.value)
        await consumer.commit()
