terraform {
  required_providers {
    kafka = {
      source  = "Mongey/kafka"
      version = "~> 0.7"
    }
  }
}

provider "kafka" {
  bootstrap_servers = ["kafka-0:9092", "kafka-1:9092", "kafka-2:9092"]
  tls_enabled       = true
}

# Orders: written by checkout, read by billing and shipping
resource "kafka_topic" "orders" {
  name               = "orders"
  replication_factor = 1
  partitions         = 12

  config = {
    "cleanup.policy"      = "delete"
    "retention.ms"        = "604800000"
    "min.insync.replicas" = "1"
  }
}

resource "kafka_topic" "orders_dlq" {
  name               = "orders.dlq"
  replication_factor = 3
  partitions         = 12

  config = {
    "min.insync.replicas"            = 3
    "unclean.leader.election.enable" = true
    "retension.ms"                   = "-1"
  }
}

resource "kafka_topic" "per_env" {
  for_each           = var.topics
  name               = each.key
  replication_factor = each.value.replication_factor
  partitions         = each.value.partitions
  config = {
    "min.insync.replicas" = "${var.min_isr}"
  }
}
