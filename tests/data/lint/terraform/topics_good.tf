resource "kafka_topic" "payments" {
  name               = "payments"
  replication_factor = 3
  partitions         = 24

  config = {
    "cleanup.policy"      = "compact"
    "min.insync.replicas" = "2"
    "max.message.bytes"   = "1048588"
  }
}

resource "confluent_kafka_topic" "invoices" {
  kafka_cluster {
    id = confluent_kafka_cluster.standard.id
  }
  topic_name       = "invoices"
  partitions_count = 6
  rest_endpoint    = confluent_kafka_cluster.standard.rest_endpoint
  config = {
    "cleanup.policy" = "delete"
    "retention.ms"   = "604800000"
  }
}

resource "aws_s3_bucket" "archive" {
  bucket = "kafka-archive"
}
