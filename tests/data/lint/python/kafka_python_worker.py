from kafka import KafkaConsumer, KafkaProducer

producer = KafkaProducer(
    bootstrap_servers=["kafka-0:9092", "kafka-1:9092"],
    acks=0,
    retries=0,
)
safe = KafkaProducer(bootstrap_servers=["kafka-0:9092", "kafka-1:9092"])
consumer = KafkaConsumer(
    "jobs",
    bootstrap_servers=["kafka-0:9092", "kafka-1:9092"],
    group_id="workers",
    auto_offset_reset="earliest",
)
for record in consumer:
    producer.send("jobs.done", record.value)
