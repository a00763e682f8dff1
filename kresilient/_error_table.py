"""The one data table behind :func:`kresilient.errors.classify`.

One row per error code that ``confluent_kafka.KafkaError`` defines (librdkafka's local codes,
negative, and the Kafka protocol codes). ``tests/test_errors.py`` enumerates
``dir(KafkaError)`` and fails if a code is missing here or if a row's name and number disagree
with the installed binding.

Columns: code, name (as ``KafkaError.name()`` spells it), category (an ``ErrorCategory`` member
name), the Java client exception users search for (empty when Java has none), a one-line
remedy, then overrides of the category defaults (see ``errors._CATEGORY_DEFAULTS``):
``retriable``, ``refresh`` (refresh metadata), ``persisted`` (a retry may duplicate: the
broker may have written it), ``fatal`` and ``action`` (an ``Action`` member name).

Sources: librdkafka ``rd_kafka_err_action()`` / produce error handling (what is retried,
refreshed, possibly persisted), the Java client's ``Errors`` enum and its
``RetriableException`` / ``InvalidMetadataException`` families, and what this project saw on a
real Kafka 4.1 cluster (see docs/errors.md).

This is a data file, which is why it is long; keep logic out of it.
"""

from __future__ import annotations

from typing import NamedTuple


class Row(NamedTuple):
    """One error code's classification, in plain data (validated by ``errors``)."""

    code: int
    name: str
    category: str
    java: str
    remedy: str
    retriable: bool | None = None
    refresh: bool | None = None
    persisted: bool | None = None
    fatal: bool | None = None
    action: str | None = None


_SIZE = "raise the topic's max.message.bytes (and broker message.max.bytes) or send smaller values"
_INTERNAL = "inter-broker/controller error, not expected by clients: report it to the operators"

# fmt: off
ROWS: tuple[Row, ...] = (
    # ---- librdkafka local errors (negative) ----
    Row(-199, "_BAD_MSG", "POISON", "CorruptRecordException",
        "Message could not be parsed (corrupt or bad format): dead-letter it"),
    Row(-198, "_BAD_COMPRESSION", "POISON", "CorruptRecordException",
        "Compressed data could not be decoded: dead-letter it; check compression.type support"),
    Row(-197, "_DESTROY", "TRANSIENT", "",
        "The client was closed with requests in flight: flush() before close()",
        retriable=False, persisted=True, action="FAIL"),
    Row(-196, "_FAIL", "TRANSIENT", "NetworkException",
        "Communication failure with a broker; librdkafka reconnects and retries", persisted=True),
    Row(-195, "_TRANSPORT", "TRANSIENT", "NetworkException / DisconnectException",
        "Broker connection lost (restart, network, idle close); retried, may duplicate "
        "without enable.idempotence", refresh=True, persisted=True),
    Row(-194, "_CRIT_SYS_RESOURCE", "CONFIG", "",
        "Critical system resource failure (threads, memory, file descriptors): fix the host"),
    Row(-193, "_RESOLVE", "TRANSIENT", "ConfigException (unresolvable bootstrap.servers)",
        "Host name resolution failed: check bootstrap.servers / advertised.listeners and DNS"),
    Row(-192, "_MSG_TIMED_OUT", "DELIVERY_TIMEOUT",
        "TimeoutException (Expiring N record(s): delivery.timeout.ms)",
        "Not acknowledged within message.timeout.ms (usually no leader, missing topic or an "
        "unreachable cluster); may have been written: re-send only with dedup"),
    Row(-191, "_PARTITION_EOF", "BENIGN", "",
        "Consumer reached the end of the partition (enable.partition.eof); nothing to do"),
    Row(-190, "_UNKNOWN_PARTITION", "CONFIG", "UnknownTopicOrPartitionException",
        "Partition does not exist in the topic: check the partition number / partition count; "
        "a record sent to it can never be produced: dead-letter it", action="DEAD_LETTER"),
    Row(-189, "_FS", "CONFIG", "",
        "File or filesystem error (certificate, keytab or state file path): fix the path"),
    Row(-188, "_UNKNOWN_TOPIC", "CONFIG",
        "UnknownTopicOrPartitionException / TimeoutException (not present in metadata)",
        "Topic does not exist and auto-creation is off: create the topic (or enable "
        "auto.create.topics.enable / allow.auto.create.topics)"),
    Row(-187, "_ALL_BROKERS_DOWN", "TRANSIENT", "",
        "No broker connection is up; librdkafka keeps reconnecting: check the cluster and "
        "bootstrap.servers"),
    Row(-186, "_INVALID_ARG", "CONFIG", "ConfigException",
        "Invalid argument or configuration (unknown property, bad value or conflicting "
        "properties): fix the config"),
    Row(-185, "_TIMED_OUT", "TRANSIENT", "TimeoutException",
        "Operation timed out (request, admin call, commit): retry; a produce may have been "
        "written", persisted=True),
    Row(-184, "_QUEUE_FULL", "BACKPRESSURE", "BufferExhaustedException (buffer.memory)",
        "Local producer queue is full (queue.buffering.max.messages/kbytes): poll(), back off, "
        "produce again"),
    Row(-183, "_ISR_INSUFF", "TRANSIENT", "NotEnoughReplicasException",
        "Fewer in-sync replicas than required: wait for the ISR to recover"),
    Row(-182, "_NODE_UPDATE", "BENIGN", "", "Broker address update (internal); nothing to do"),
    Row(-181, "_SSL", "AUTH", "SslAuthenticationException",
        "TLS handshake or certificate failure: check ssl.* config, CA and host names"),
    Row(-180, "_WAIT_COORD", "TRANSIENT", "CoordinatorNotAvailableException",
        "Waiting for the group/transaction coordinator; retried", refresh=True),
    Row(-179, "_UNKNOWN_GROUP", "GROUP", "GroupIdNotFoundException",
        "Unknown consumer group: check group.id", action="FAIL", retriable=False),
    Row(-178, "_IN_PROGRESS", "TRANSIENT", "",
        "Operation already in progress: wait for it and retry"),
    Row(-177, "_PREV_IN_PROGRESS", "TRANSIENT", "",
        "A previous operation is still in progress (e.g. a transaction call): retry it"),
    Row(-176, "_EXISTING_SUBSCRIPTION", "CONFIG", "IllegalStateException",
        "Consumer already has a conflicting subscription/assignment: use one API"),
    Row(-175, "_ASSIGN_PARTITIONS", "BENIGN", "", "Rebalance: partitions assigned"),
    Row(-174, "_REVOKE_PARTITIONS", "BENIGN", "", "Rebalance: partitions revoked"),
    Row(-173, "_CONFLICT", "CONFIG", "IllegalStateException",
        "Conflicting use of the API (e.g. mixing subscribe and assign): fix the call sequence"),
    Row(-172, "_STATE", "CONFIG", "IllegalStateException",
        "API called in the wrong state (e.g. transactional call out of order, store_offsets "
        "on an unassigned partition): fix the call sequence"),
    Row(-171, "_UNKNOWN_PROTOCOL", "CONFIG", "",
        "Unknown protocol (security.protocol or assignor): fix the config"),
    Row(-170, "_NOT_IMPLEMENTED", "CONFIG", "UnsupportedOperationException",
        "Feature not built into this librdkafka: use another option or build"),
    Row(-169, "_AUTHENTICATION", "AUTH", "AuthenticationException / SaslAuthenticationException",
        "Authentication failed: check sasl.* credentials and mechanism"),
    Row(-168, "_NO_OFFSET", "BENIGN", "", "No offset stored yet for the partition; nothing to do"),
    Row(-167, "_OUTDATED", "BENIGN", "", "Outdated (superseded) result; nothing to do"),
    Row(-166, "_TIMED_OUT_QUEUE", "TRANSIENT", "TimeoutException",
        "Timed out while queued locally (never sent); retried"),
    Row(-165, "_UNSUPPORTED_FEATURE", "CONFIG", "UnsupportedVersionException",
        "The broker does not support a required feature (e.g. idempotence, transactions): "
        "upgrade the broker or change config"),
    Row(-164, "_WAIT_CACHE", "TRANSIENT", "", "Waiting for a metadata cache update; retry"),
    Row(-163, "_INTR", "TRANSIENT", "InterruptException", "Operation interrupted; retry"),
    Row(-162, "_KEY_SERIALIZATION", "POISON", "SerializationException",
        "Key could not be serialized: fix the key or dead-letter the record"),
    Row(-161, "_VALUE_SERIALIZATION", "POISON", "SerializationException",
        "Value could not be serialized: fix the value or dead-letter the record"),
    Row(-160, "_KEY_DESERIALIZATION", "POISON", "RecordDeserializationException",
        "Key could not be deserialized: dead-letter the record and continue"),
    Row(-159, "_VALUE_DESERIALIZATION", "POISON", "RecordDeserializationException",
        "Value could not be deserialized: dead-letter the record and continue"),
    Row(-158, "_PARTIAL", "TRANSIENT", "", "Partial response; retry"),
    Row(-157, "_READ_ONLY", "CONFIG", "", "Read-only object modified: fix the calling code"),
    Row(-156, "_NOENT", "CONFIG", "", "No such entry (e.g. header or config key): fix the call"),
    Row(-155, "_UNDERFLOW", "POISON", "", "Read underflow while parsing data: dead-letter it"),
    Row(-154, "_INVALID_TYPE", "CONFIG", "", "Invalid type passed to the API: fix the call"),
    Row(-153, "_RETRY", "TRANSIENT", "", "librdkafka asks for the operation to be retried"),
    Row(-152, "_PURGE_QUEUE", "DELIVERY_TIMEOUT", "",
        "Purged from the local queue before sending (purge() or close): never written; "
        "re-send if still needed", persisted=False),
    Row(-151, "_PURGE_INFLIGHT", "DELIVERY_TIMEOUT", "",
        "Purged while in flight (purge() or close): may have been written; re-send only "
        "with dedup"),
    Row(-150, "_FATAL", "FATAL_PRODUCER", "KafkaException (fatal)",
        "Fatal client error: the real cause is in the message (unwrapped when possible); "
        "flush what you can, then recreate the client"),
    Row(-149, "_INCONSISTENT", "FATAL_PRODUCER", "IllegalStateException",
        "Inconsistent internal state (idempotent producer): recreate the producer"),
    Row(-148, "_GAPLESS_GUARANTEE", "FATAL_PRODUCER", "OutOfOrderSequenceException",
        "A message was lost and enable.gapless.guarantee forbids going on: recreate the "
        "producer and re-send from your source"),
    Row(-147, "_MAX_POLL_EXCEEDED", "GROUP", "CommitFailedException",
        "max.poll.interval.ms exceeded: the consumer left the group; poll more often or "
        "raise max.poll.interval.ms; uncommitted work will be redelivered"),
    Row(-146, "_UNKNOWN_BROKER", "CONFIG", "", "Unknown broker id: check the id used"),
    Row(-145, "_NOT_CONFIGURED", "CONFIG", "",
        "Functionality not configured (e.g. transactions without transactional.id)"),
    Row(-144, "_FENCED", "FATAL_PRODUCER", "ProducerFencedException",
        "Fenced by a newer instance with the same transactional.id / group.instance.id: "
        "stop this instance"),
    Row(-143, "_APPLICATION", "UNKNOWN", "",
        "Application-generated error: see the message text"),
    Row(-142, "_ASSIGNMENT_LOST", "GROUP", "CommitFailedException (partitions lost)",
        "Partition assignment lost (session timeout or fencing): drop uncommitted work and "
        "rejoin"),
    Row(-141, "_NOOP", "BENIGN", "", "No operation performed; nothing to do"),
    Row(-140, "_AUTO_OFFSET_RESET", "OFFSET_RESET",
        "NoOffsetForPartitionException / OffsetOutOfRangeException",
        "No valid offset and auto.offset.reset=error: choose a reset policy or seek; data may "
        "have been skipped"),
    Row(-139, "_LOG_TRUNCATION", "OFFSET_RESET", "LogTruncationException",
        "Log truncation detected after an unclean leader election: records may be lost; "
        "seek and alert"),
    Row(-138, "_INVALID_DIFFERENT_RECORD", "TRANSIENT", "InvalidRecordException (batch)",
        "Another record in the same batch was invalid; this one is fine: re-send it",
        action="RETRY"),
    Row(-137, "_DESTROY_BROKER", "TRANSIENT", "",
        "Broker connection decommissioned (broker removed from metadata); retried",
        refresh=True),
    # ---- Kafka protocol errors ----
    Row(-1, "UNKNOWN", "UNKNOWN", "UnknownServerException",
        "Unexpected server error: see the broker log"),
    Row(0, "NO_ERROR", "BENIGN", "", "Success"),
    Row(1, "OFFSET_OUT_OF_RANGE", "OFFSET_RESET", "OffsetOutOfRangeException",
        "Offset outside the log (retention deleted it): auto.offset.reset applies; data may "
        "have been skipped"),
    Row(2, "INVALID_MSG", "TRANSIENT", "CorruptRecordException",
        "CRC check failed (corrupted in transit); retried"),
    Row(3, "UNKNOWN_TOPIC_OR_PART", "LEADERSHIP", "UnknownTopicOrPartitionException",
        "This broker does not host the partition (moved, not yet created, or missing topic); "
        "refresh metadata and retry; persistent: create the topic"),
    Row(4, "INVALID_MSG_SIZE", "CONFIG", "InvalidFetchSizeException",
        "Invalid fetch size: check fetch.max.bytes / max.partition.fetch.bytes"),
    Row(5, "LEADER_NOT_AVAILABLE", "LEADERSHIP", "LeaderNotAvailableException",
        "Leader election in progress (restart, failover, new topic); retried after a metadata "
        "refresh; sustained: unhealthy controller or no in-sync replica"),
    Row(6, "NOT_LEADER_FOR_PARTITION", "LEADERSHIP",
        "NotLeaderOrFollowerException, formerly NotLeaderForPartitionException",
        "Stale leader metadata after a leader move (restart, election, reassignment); "
        "refresh and retry; sustained: flapping broker or unhealthy controller"),
    Row(7, "REQUEST_TIMED_OUT", "TRANSIENT", "TimeoutException",
        "Broker did not finish in time (often acks=all waiting for replicas); retried, may "
        "duplicate without enable.idempotence", persisted=True),
    Row(8, "BROKER_NOT_AVAILABLE", "LEADERSHIP", "BrokerNotAvailableException",
        "The broker is not available (shutting down or starting); refresh and retry"),
    Row(9, "REPLICA_NOT_AVAILABLE", "LEADERSHIP", "ReplicaNotAvailableException",
        "Replica not available (reassignment or broker restart); refresh and retry"),
    Row(10, "MSG_SIZE_TOO_LARGE", "CONFIG", "RecordTooLargeException",
        "Message larger than the topic's max.message.bytes or the broker's message.max.bytes "
        "(client limit: message.max.bytes): " + _SIZE, action="DEAD_LETTER"),
    Row(11, "STALE_CTRL_EPOCH", "UNKNOWN", "ControllerMovedException", _INTERNAL),
    Row(12, "OFFSET_METADATA_TOO_LARGE", "CONFIG", "OffsetMetadataTooLarge",
        "Commit metadata string too large (offset.metadata.max.bytes): shorten it"),
    Row(13, "NETWORK_EXCEPTION", "TRANSIENT", "NetworkException",
        "Broker disconnected before responding; retried, may duplicate without "
        "enable.idempotence", refresh=True, persisted=True),
    Row(14, "COORDINATOR_LOAD_IN_PROGRESS", "TRANSIENT", "CoordinatorLoadInProgressException",
        "Coordinator is loading its state (after failover); retry"),
    Row(15, "COORDINATOR_NOT_AVAILABLE", "TRANSIENT", "CoordinatorNotAvailableException",
        "Group/transaction coordinator unavailable (internal topic offline?); retry",
        refresh=True),
    Row(16, "NOT_COORDINATOR", "TRANSIENT", "NotCoordinatorException",
        "Coordinator moved; rediscover and retry", refresh=True),
    Row(17, "TOPIC_EXCEPTION", "CONFIG", "InvalidTopicException",
        "Invalid topic name or operation on an internal topic: fix the topic name"),
    Row(18, "RECORD_LIST_TOO_LARGE", "CONFIG", "RecordBatchTooLargeException",
        "Batch larger than the broker's segment size: lower batch.size or raise segment.bytes",
        action="DEAD_LETTER"),
    Row(19, "NOT_ENOUGH_REPLICAS", "TRANSIENT", "NotEnoughReplicasException",
        "Fewer in-sync replicas than min.insync.replicas (not written); retry; sustained: "
        "restore the down brokers"),
    Row(20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "TRANSIENT",
        "NotEnoughReplicasAfterAppendException",
        "Written to the leader but the ISR shrank below min.insync.replicas; retry may "
        "duplicate without enable.idempotence", persisted=True),
    Row(21, "INVALID_REQUIRED_ACKS", "CONFIG", "InvalidRequiredAcksException",
        "Invalid acks value: use acks=all"),
    Row(22, "ILLEGAL_GENERATION", "GROUP", "IllegalGenerationException",
        "Group generation changed (rebalance): drop uncommitted work and rejoin"),
    Row(23, "INCONSISTENT_GROUP_PROTOCOL", "CONFIG", "InconsistentGroupProtocolException",
        "Group members use incompatible assignors/protocols: align "
        "partition.assignment.strategy / group.protocol"),
    Row(24, "INVALID_GROUP_ID", "CONFIG", "InvalidGroupIdException",
        "Invalid group.id: set a non-empty group.id"),
    Row(25, "UNKNOWN_MEMBER_ID", "GROUP", "UnknownMemberIdException",
        "Coordinator forgot this member (session expired): rejoin; uncommitted work will be "
        "redelivered"),
    Row(26, "INVALID_SESSION_TIMEOUT", "CONFIG", "InvalidSessionTimeoutException",
        "session.timeout.ms outside the broker's group.min/max.session.timeout.ms"),
    Row(27, "REBALANCE_IN_PROGRESS", "GROUP", "RebalanceInProgressException",
        "Group is rebalancing: commit failed; rejoin and continue"),
    Row(28, "INVALID_COMMIT_OFFSET_SIZE", "CONFIG", "InvalidCommitOffsetSizeException",
        "Commit request too large: commit fewer partitions at once"),
    Row(29, "TOPIC_AUTHORIZATION_FAILED", "AUTH", "TopicAuthorizationException",
        "Not authorized for the topic: grant the ACL (Write/Read/Describe)"),
    Row(30, "GROUP_AUTHORIZATION_FAILED", "AUTH", "GroupAuthorizationException",
        "Not authorized for the consumer group: grant the group ACL"),
    Row(31, "CLUSTER_AUTHORIZATION_FAILED", "AUTH", "ClusterAuthorizationException",
        "Not authorized for a cluster operation: an idempotent producer needs WRITE on a topic "
        "(older brokers: IdempotentWrite on the cluster); grant the ACL"),
    Row(32, "INVALID_TIMESTAMP", "POISON", "InvalidTimestampException",
        "Record timestamp outside message.timestamp.before/after.max.ms: fix the timestamp "
        "or dead-letter it"),
    Row(33, "UNSUPPORTED_SASL_MECHANISM", "AUTH", "UnsupportedSaslMechanismException",
        "Broker does not enable this sasl.mechanism: align client and broker"),
    Row(34, "ILLEGAL_SASL_STATE", "AUTH", "IllegalSaslStateException",
        "SASL handshake out of order: check security.protocol and sasl.* config"),
    Row(35, "UNSUPPORTED_VERSION", "CONFIG", "UnsupportedVersionException",
        "API version not supported by the broker: upgrade the broker or disable the feature"),
    Row(36, "TOPIC_ALREADY_EXISTS", "BENIGN", "TopicExistsException",
        "Topic already exists (create is idempotent for you); nothing to do"),
    Row(37, "INVALID_PARTITIONS", "CONFIG", "InvalidPartitionsException",
        "Invalid partition count: use >= 1 (and more than today when adding)"),
    Row(38, "INVALID_REPLICATION_FACTOR", "CONFIG", "InvalidReplicationFactorException",
        "Replication factor below 1 or above the number of brokers"),
    Row(39, "INVALID_REPLICA_ASSIGNMENT", "CONFIG", "InvalidReplicaAssignmentException",
        "Invalid replica assignment: fix the broker ids"),
    Row(40, "INVALID_CONFIG", "CONFIG", "InvalidConfigurationException",
        "Invalid topic/broker configuration value: fix it"),
    Row(41, "NOT_CONTROLLER", "TRANSIENT", "NotControllerException",
        "Controller moved; retry the admin request", refresh=True),
    Row(42, "INVALID_REQUEST", "CONFIG", "InvalidRequestException",
        "Malformed or incompatible request: see the broker log; check client/broker versions"),
    Row(43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", "CONFIG", "UnsupportedForMessageFormatException",
        "The topic's message format is too old for this request: upgrade the format"),
    Row(44, "POLICY_VIOLATION", "CONFIG", "PolicyViolationException",
        "Rejected by a broker policy (create/alter topic policy): comply with the policy"),
    Row(45, "OUT_OF_ORDER_SEQUENCE_NUMBER", "FATAL_PRODUCER", "OutOfOrderSequenceException",
        "Idempotent sequence gap (data loss on the broker side): recreate the producer and "
        "re-send unacknowledged messages", persisted=True),
    Row(46, "DUPLICATE_SEQUENCE_NUMBER", "BENIGN", "DuplicateSequenceException",
        "Duplicate of an already written message (idempotence worked); treated as success"),
    Row(47, "INVALID_PRODUCER_EPOCH", "ABORTABLE",
        "InvalidProducerEpochException (ProducerFencedException in old clients)",
        "Old producer epoch: abort the transaction and retry it; an idempotent producer bumps "
        "its epoch (re-send); raised as fatal (_FENCED) when fenced"),
    Row(48, "INVALID_TXN_STATE", "FATAL_PRODUCER", "InvalidTxnStateException",
        "Transactional call in an invalid state: recreate the producer"),
    Row(49, "INVALID_PRODUCER_ID_MAPPING", "FATAL_PRODUCER", "InvalidPidMappingException",
        "transactional.id no longer maps to this producer id (expired): recreate the producer"),
    Row(50, "INVALID_TRANSACTION_TIMEOUT", "CONFIG", "InvalidTxnTimeoutException",
        "transaction.timeout.ms above the broker's transaction.max.timeout.ms: lower it"),
    Row(51, "CONCURRENT_TRANSACTIONS", "TRANSIENT", "ConcurrentTransactionsException",
        "Previous transaction still completing; retry"),
    Row(52, "TRANSACTION_COORDINATOR_FENCED", "UNKNOWN", "TransactionCoordinatorFencedException",
        _INTERNAL),
    Row(53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "AUTH",
        "TransactionalIdAuthorizationException",
        "Not authorized for the transactional.id: grant the TransactionalId ACL", fatal=True),
    Row(54, "SECURITY_DISABLED", "CONFIG", "SecurityDisabledException",
        "Security features are disabled on the broker: enable them or drop the call"),
    Row(55, "OPERATION_NOT_ATTEMPTED", "TRANSIENT", "OperationNotAttemptedException",
        "Not attempted because another part of the batch failed: fix that one, then retry"),
    Row(56, "KAFKA_STORAGE_ERROR", "LEADERSHIP", "KafkaStorageException",
        "Disk error on the broker (log dir offline); leadership moves: refresh and retry; "
        "alert the operators"),
    Row(57, "LOG_DIR_NOT_FOUND", "CONFIG", "LogDirNotFoundException",
        "Log directory not in the broker config: fix the path"),
    Row(58, "SASL_AUTHENTICATION_FAILED", "AUTH", "SaslAuthenticationException",
        "SASL authentication failed: check credentials and mechanism"),
    Row(59, "UNKNOWN_PRODUCER_ID", "TRANSIENT", "UnknownProducerIdException",
        "Broker lost this producer's state (records expired); librdkafka bumps the epoch: "
        "re-send; in a transaction, abort it", action="RETRY"),
    Row(60, "REASSIGNMENT_IN_PROGRESS", "TRANSIENT", "ReassignmentInProgressException",
        "A partition reassignment is in progress; retry later"),
    Row(61, "DELEGATION_TOKEN_AUTH_DISABLED", "AUTH", "DelegationTokenDisabledException",
        "Delegation tokens are disabled on the broker"),
    Row(62, "DELEGATION_TOKEN_NOT_FOUND", "AUTH", "DelegationTokenNotFoundException",
        "Delegation token not found: create a new one"),
    Row(63, "DELEGATION_TOKEN_OWNER_MISMATCH", "AUTH", "DelegationTokenOwnerMismatchException",
        "Principal is not the token's owner/renewer"),
    Row(64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", "AUTH",
        "UnsupportedByAuthenticationException",
        "Delegation token requests need an authenticated (SASL/mTLS) connection"),
    Row(65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", "AUTH",
        "DelegationTokenAuthorizationException", "Not authorized for delegation tokens"),
    Row(66, "DELEGATION_TOKEN_EXPIRED", "AUTH", "DelegationTokenExpiredException",
        "Delegation token expired: renew or create a new one"),
    Row(67, "INVALID_PRINCIPAL_TYPE", "CONFIG", "InvalidPrincipalTypeException",
        "Unsupported principal type: use User:..."),
    Row(68, "NON_EMPTY_GROUP", "CONFIG", "GroupNotEmptyException",
        "Group still has members: stop them before deleting/resetting the group"),
    Row(69, "GROUP_ID_NOT_FOUND", "CONFIG", "GroupIdNotFoundException",
        "Consumer group does not exist: check the group id"),
    Row(70, "FETCH_SESSION_ID_NOT_FOUND", "TRANSIENT", "FetchSessionIdNotFoundException",
        "Fetch session evicted on the broker; the consumer opens a new one"),
    Row(71, "INVALID_FETCH_SESSION_EPOCH", "TRANSIENT", "InvalidFetchSessionEpochException",
        "Fetch session out of sync; the consumer opens a new one"),
    Row(72, "LISTENER_NOT_FOUND", "LEADERSHIP", "ListenerNotFoundException",
        "Leader has no listener matching the one used (starting broker or listener "
        "mismatch); refresh and retry; persistent: check listeners on all brokers"),
    Row(73, "TOPIC_DELETION_DISABLED", "CONFIG", "TopicDeletionDisabledException",
        "delete.topic.enable=false on the broker"),
    Row(74, "FENCED_LEADER_EPOCH", "LEADERSHIP", "FencedLeaderEpochException",
        "Request carried an older leader epoch than the broker (leader moved); refresh and "
        "retry"),
    Row(75, "UNKNOWN_LEADER_EPOCH", "LEADERSHIP", "UnknownLeaderEpochException",
        "Request carried a newer leader epoch than the broker knows (metadata propagating); "
        "refresh and retry"),
    Row(76, "UNSUPPORTED_COMPRESSION_TYPE", "CONFIG", "UnsupportedCompressionTypeException",
        "Compression type unsupported by this client/broker pairing: change compression.type"),
    Row(77, "STALE_BROKER_EPOCH", "UNKNOWN", "StaleBrokerEpochException", _INTERNAL),
    Row(78, "OFFSET_NOT_AVAILABLE", "LEADERSHIP", "OffsetNotAvailableException",
        "New leader's high watermark not caught up after an election; retried"),
    Row(79, "MEMBER_ID_REQUIRED", "GROUP", "MemberIdRequiredException",
        "Join needs a member id (handled by the client): rejoin"),
    Row(80, "PREFERRED_LEADER_NOT_AVAILABLE", "LEADERSHIP",
        "PreferredLeaderNotAvailableException",
        "Preferred leader not in the ISR, election not possible now; retry later"),
    Row(81, "GROUP_MAX_SIZE_REACHED", "CONFIG", "GroupMaxSizeReachedException",
        "Consumer group reached group.max.size: fewer consumers or raise the limit"),
    Row(82, "FENCED_INSTANCE_ID", "GROUP", "FencedInstanceIdException",
        "Another consumer uses the same group.instance.id: give each instance its own id",
        fatal=True, action="FAIL"),
    Row(83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", "LEADERSHIP",
        "EligibleLeadersNotAvailableException",
        "No eligible leader for the election (replicas offline); retry when brokers return"),
    Row(84, "ELECTION_NOT_NEEDED", "BENIGN", "ElectionNotNeededException",
        "Leader already preferred; nothing to do"),
    Row(85, "NO_REASSIGNMENT_IN_PROGRESS", "BENIGN", "NoReassignmentInProgressException",
        "No reassignment to cancel; nothing to do"),
    Row(86, "GROUP_SUBSCRIBED_TO_TOPIC", "CONFIG", "GroupSubscribedToTopicException",
        "Cannot delete offsets of a topic the group is subscribed to: stop the group first"),
    Row(87, "INVALID_RECORD", "POISON", "InvalidRecordException",
        "Broker rejected the record (e.g. null key on a compacted topic, schema validation): "
        "dead-letter it"),
    Row(88, "UNSTABLE_OFFSET_COMMIT", "TRANSIENT", "UnstableOffsetCommitException",
        "Pending transactional offsets not yet stable; retry"),
    Row(89, "THROTTLING_QUOTA_EXCEEDED", "BACKPRESSURE", "ThrottlingQuotaExceededException",
        "Admin mutation quota exceeded: back off and retry"),
    Row(90, "PRODUCER_FENCED", "FATAL_PRODUCER", "ProducerFencedException",
        "A newer producer with the same transactional.id took over: stop this instance"),
    Row(91, "RESOURCE_NOT_FOUND", "CONFIG", "ResourceNotFoundException",
        "Referenced resource does not exist: fix the request"),
    Row(92, "DUPLICATE_RESOURCE", "CONFIG", "DuplicateResourceException",
        "Same resource referenced twice in one request: fix the request"),
    Row(93, "UNACCEPTABLE_CREDENTIAL", "CONFIG", "UnacceptableCredentialException",
        "Credential does not meet the broker's criteria (e.g. SCRAM iterations)"),
    Row(94, "INCONSISTENT_VOTER_SET", "UNKNOWN", "InconsistentVoterSetException", _INTERNAL),
    Row(95, "INVALID_UPDATE_VERSION", "CONFIG", "InvalidUpdateVersionException",
        "Invalid feature update version: fix the requested version"),
    Row(96, "FEATURE_UPDATE_FAILED", "CONFIG", "FeatureUpdateFailedException",
        "Feature update failed on the controller: see the controller log"),
    Row(97, "PRINCIPAL_DESERIALIZATION_FAILURE", "UNKNOWN", "PrincipalDeserializationException",
        _INTERNAL),
    Row(100, "UNKNOWN_TOPIC_ID", "LEADERSHIP", "UnknownTopicIdException",
        "Broker does not host this topic id yet (or it was recreated); refresh and retry"),
    Row(103, "INCONSISTENT_TOPIC_ID", "LEADERSHIP", "InconsistentTopicIdException",
        "Topic id mismatch (topic deleted and recreated); refresh metadata"),
    Row(110, "FENCED_MEMBER_EPOCH", "GROUP", "FencedMemberEpochException",
        "Member epoch fenced (KIP-848): abandon partitions and rejoin"),
    Row(111, "UNRELEASED_INSTANCE_ID", "GROUP", "UnreleasedInstanceIdException",
        "group.instance.id still held by a previous member: wait for it to leave"),
    Row(112, "UNSUPPORTED_ASSIGNOR", "CONFIG", "UnsupportedAssignorException",
        "group.remote.assignor not supported by the broker: change it"),
    Row(113, "STALE_MEMBER_EPOCH", "GROUP", "StaleMemberEpochException",
        "Member epoch stale (KIP-848): the client refreshes it and retries"),
    Row(114, "MISMATCHED_ENDPOINT_TYPE", "CONFIG", "MismatchedEndpointTypeException",
        "Request sent to a controller endpoint: bootstrap.servers must list broker listeners"),
    Row(115, "UNSUPPORTED_ENDPOINT_TYPE", "CONFIG", "UnsupportedEndpointTypeException",
        "Endpoint type not supported: use broker listeners in bootstrap.servers"),
    Row(116, "UNKNOWN_CONTROLLER_ID", "CONFIG", "UnknownControllerIdException",
        "Unknown controller id in an admin request: check the id"),
    Row(117, "UNKNOWN_SUBSCRIPTION_ID", "BENIGN", "UnknownSubscriptionIdException",
        "Client telemetry subscription outdated; renewed automatically"),
    Row(118, "TELEMETRY_TOO_LARGE", "BENIGN", "TelemetryTooLargeException",
        "Client telemetry push too large; dropped, nothing to do"),
    Row(119, "INVALID_REGISTRATION", "UNKNOWN", "InvalidRegistrationException", _INTERNAL),
    Row(120, "TRANSACTION_ABORTABLE", "ABORTABLE", "TransactionAbortableException",
        "Transaction hit a recoverable error: abort_transaction() and retry it"),
    Row(121, "INVALID_RECORD_STATE", "CONFIG", "InvalidRecordStateException",
        "Share-group acknowledgement of a record in the wrong state: fix the ack sequence"),
    Row(122, "SHARE_SESSION_NOT_FOUND", "TRANSIENT", "ShareSessionNotFoundException",
        "Share session evicted; a new one is opened"),
    Row(123, "INVALID_SHARE_SESSION_EPOCH", "TRANSIENT", "InvalidShareSessionEpochException",
        "Share session out of sync; a new one is opened"),
    Row(124, "FENCED_STATE_EPOCH", "UNKNOWN", "FencedStateEpochException", _INTERNAL),
    Row(125, "INVALID_VOTER_KEY", "UNKNOWN", "InvalidVoterKeyException", _INTERNAL),
    Row(126, "DUPLICATE_VOTER", "UNKNOWN", "DuplicateVoterException", _INTERNAL),
    Row(127, "VOTER_NOT_FOUND", "UNKNOWN", "VoterNotFoundException", _INTERNAL),
    Row(128, "INVALID_REGULAR_EXPRESSION", "CONFIG", "InvalidRegularExpression",
        "Invalid subscription regular expression: fix the pattern"),
    Row(129, "REBOOTSTRAP_REQUIRED", "TRANSIENT", "RebootstrapRequiredException",
        "Client metadata stale: the client re-bootstraps (metadata.recovery.strategy)",
        refresh=True),
    Row(130, "STREAMS_INVALID_TOPOLOGY", "CONFIG", "StreamsInvalidTopologyException",
        "Invalid streams topology"),
    Row(131, "STREAMS_INVALID_TOPOLOGY_EPOCH", "CONFIG", "StreamsInvalidTopologyEpochException",
        "Invalid streams topology epoch"),
    Row(132, "STREAMS_TOPOLOGY_FENCED", "GROUP", "StreamsTopologyFencedException",
        "Streams topology epoch outdated: rejoin"),
    Row(133, "SHARE_SESSION_LIMIT_REACHED", "BACKPRESSURE", "ShareSessionLimitReachedException",
        "Broker share-session limit reached: back off and retry"),
)

#: Rows that replace ROWS inside a delivery report (``classify(err, context="delivery")``).
#: librdkafka retries leadership errors internally until message.timeout.ms, so a code that
#: reaches a delivery report means something more specific than on the wire. Seen on a real
#: Kafka 4.1 cluster (tests/test_classification_cluster.py, 6e): producing to a missing topic
#: (broker auto.create.topics.enable=false) fails with UNKNOWN_TOPIC_OR_PART once
#: topic.metadata.propagation.max.ms (30 s) has passed, or with _MSG_TIMED_OUT when
#: message.timeout.ms is shorter than that.
DELIVERY_ROWS: tuple[Row, ...] = (
    # librdkafka reports _BAD_MSG to a producer when the produce RESPONSE could not be parsed
    # (rd_kafka_handle_Produce_error: PERMANENT | MSG_POSSIBLY_PERSISTED): not the record's
    # fault, and it may be written.
    Row(-199, "_BAD_MSG", "UNKNOWN", "CorruptRecordException",
        "The broker's produce response could not be parsed; the message may have been "
        "written: re-send only with dedup; check client/broker versions",
        persisted=True, action="FAIL"),
    Row(3, "UNKNOWN_TOPIC_OR_PART", "CONFIG", "UnknownTopicOrPartitionException",
        "The topic (or partition) does not exist: librdkafka waited "
        "topic.metadata.propagation.max.ms for it; create the topic (broker "
        "auto.create.topics.enable is off) or fix the topic name"),
    # A report can only be served by a live client, so _DESTROY here is not a closed client:
    # librdkafka dropped the partition the message was queued on (seen on 2.16.0 when a topic
    # was deleted while producing: "partition count changed from 3 to 0", the messages
    # waiting to be sent failed _DESTROY beside _UNKNOWN_PARTITION).
    Row(-197, "_DESTROY", "CONFIG", "",
        "The partition this message was queued on disappeared from the cluster's metadata "
        "(the topic was deleted?): check that the topic exists; the message may have been "
        "written before it went",
        retriable=False, persisted=True, action="FAIL"),
)

#: Codes that only arise on one side of a client: translate() picks ProduceError or
#: ConsumeError from these when the caller does not say which operation failed.
PRODUCE_ONLY: tuple[str, ...] = (
    "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "_MSG_TIMED_OUT", "_QUEUE_FULL",
    "_PURGE_QUEUE", "_PURGE_INFLIGHT", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
    "_KEY_SERIALIZATION", "_VALUE_SERIALIZATION", "INVALID_TIMESTAMP", "INVALID_RECORD",
    "_INVALID_DIFFERENT_RECORD",
)
CONSUME_ONLY: tuple[str, ...] = (
    "_PARTITION_EOF", "OFFSET_OUT_OF_RANGE", "_AUTO_OFFSET_RESET", "_LOG_TRUNCATION",
    "_KEY_DESERIALIZATION", "_VALUE_DESERIALIZATION", "_MAX_POLL_EXCEEDED", "_ASSIGNMENT_LOST",
)
# fmt: on
